#include "metronome/base/thread_pool.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "metronome/base/check.h"

namespace metronome::base {
namespace {

// ---- futex on a 32-bit atomic (std::atomic<uint32_t> is layout-compatible with uint32_t) ----

void FutexWait(std::atomic<std::uint32_t>* word, std::uint32_t expected) noexcept {
  // Returns at once if *word != expected (checked atomically by the kernel), on a wake, or
  // spuriously: callers loop on their condition.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

void FutexWake(std::atomic<std::uint32_t>* word, int count) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE_PRIVATE, count, nullptr,
          nullptr, 0);
}

inline void CpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

std::int64_t NowNs() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Spins until pred() or `spin_ns` elapsed; returns pred()'s last value.
template <typename Pred>
bool SpinUntil(Pred pred, std::int64_t spin_ns) noexcept {
  if (pred()) return true;
  if (spin_ns <= 0) return false;
  const std::int64_t deadline = NowNs() + spin_ns;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      CpuRelax();
      if (pred()) return true;
    }
    if (NowNs() >= deadline) return pred();
  }
}

std::optional<std::int64_t> ParseInt(std::string_view s) {
  std::int64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

std::optional<std::string> ReadSmallFile(const char* path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

// ---- CPU count ----------------------------------------------------------------------------------

std::optional<double> ParseCgroupV2CpuMax(std::string_view text) {
  text = Trim(text);
  const std::size_t sp = text.find(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  const std::string_view quota = text.substr(0, sp);
  const std::string_view period = Trim(text.substr(sp + 1));
  if (quota == "max") return std::nullopt;
  const auto q = ParseInt(quota);
  const auto p = ParseInt(period);
  if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;
  return static_cast<double>(*q) / static_cast<double>(*p);
}

std::optional<double> ParseCgroupV1CpuQuota(std::string_view quota_text,
                                            std::string_view period_text) {
  const auto q = ParseInt(Trim(quota_text));
  const auto p = ParseInt(Trim(period_text));
  if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;  // -1: unlimited
  return static_cast<double>(*q) / static_cast<double>(*p);
}

int CpuCountFrom(int affinity_cpus, std::optional<double> quota_cpus) {
  int n = std::max(1, affinity_cpus);
  if (quota_cpus && *quota_cpus > 0.0) {
    // A quota of 1.5 CPUs still lets two threads run at once; a third would only queue.
    const double ceil_quota = std::ceil(*quota_cpus - 1e-9);
    if (ceil_quota < static_cast<double>(n)) n = static_cast<int>(ceil_quota);
  }
  return std::max(1, n);
}

int DetectedCpuCount() {
  int affinity = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    affinity = CPU_COUNT(&set);
  } else {
    affinity = static_cast<int>(std::thread::hardware_concurrency());
  }
  std::optional<double> quota;
  if (const auto v2 = ReadSmallFile("/sys/fs/cgroup/cpu.max")) {
    quota = ParseCgroupV2CpuMax(*v2);
  } else {
    for (const char* dir : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
      const auto q = ReadSmallFile((std::string(dir) + "/cpu.cfs_quota_us").c_str());
      const auto p = ReadSmallFile((std::string(dir) + "/cpu.cfs_period_us").c_str());
      if (q && p) {
        quota = ParseCgroupV1CpuQuota(*q, *p);
        break;
      }
    }
  }
  return CpuCountFrom(affinity, quota);
}

// ---- the pool -----------------------------------------------------------------------------------

ThreadPool::ThreadPool(const ThreadPoolOptions& options) {
  MTR_CHECK(options.num_threads >= 0, "ThreadPoolOptions::num_threads must be >= 0");
  MTR_CHECK(options.spin_us >= 0.0, "ThreadPoolOptions::spin_us must be >= 0");
  num_threads_ = options.num_threads > 0 ? options.num_threads : DetectedCpuCount();
  spin_ns_ = static_cast<std::int64_t>(options.spin_us * 1e3);
  // Chunk indices live in 16-bit fields of a segment word (at most kChunksPerThread per thread).
  MTR_CHECK(num_threads_ <= 4096, "ThreadPoolOptions::num_threads must be <= 4096");
  segments_ = std::make_unique<Segment[]>(static_cast<std::size_t>(num_threads_));
  workers_.reserve(static_cast<std::size_t>(num_threads_ - 1));
  for (int slot = 1; slot < num_threads_; ++slot) {
    workers_.emplace_back([this, slot] { WorkerLoop(slot); });
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  FutexWake(&epoch_, INT_MAX);
  for (std::thread& t : workers_) t.join();
}

namespace {
constexpr std::uint64_t kEpochMask = ~std::uint64_t{0xffffffff};
constexpr std::uint32_t kFieldBits = 16;  // front and back: chunk indices < 2^16
constexpr std::uint64_t kFieldMask = (std::uint64_t{1} << kFieldBits) - 1;

// Claims one chunk of `segment` for job `tag` (epoch << 32): from the front (the owner, keeping
// its stream in order) or from the back (a thief). -1 when the segment belongs to another job or
// has nothing left.
std::int64_t ClaimChunk(std::atomic<std::uint64_t>& segment, std::uint64_t tag,
                        bool from_front) noexcept {
  std::uint64_t cur = segment.load(std::memory_order_acquire);
  for (;;) {
    // A claim is valid only for this epoch's job and while chunks are left; a late worker that
    // sees a newer epoch or an exhausted segment claims nothing.
    if ((cur & kEpochMask) != tag) return -1;
    const std::uint64_t front = (cur >> kFieldBits) & kFieldMask;
    const std::uint64_t back = cur & kFieldMask;
    if (front >= back) return -1;
    const std::uint64_t next = from_front ? cur + (std::uint64_t{1} << kFieldBits) : cur - 1;
    if (segment.compare_exchange_weak(cur, next, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      return static_cast<std::int64_t>(from_front ? front : back - 1);
    }
  }
}
}  // namespace

void ThreadPool::RunChunks(std::uint32_t epoch, int slot) noexcept {
  const std::uint64_t tag = static_cast<std::uint64_t>(epoch) << 32;
  // Own segment first, front to back; then the others' from their backs, nearest slot first.
  for (int k = 0; k < num_threads_; ++k) {
    const int victim = (slot + k) % num_threads_;
    std::atomic<std::uint64_t>& segment = segments_[static_cast<std::size_t>(victim)].word;
    for (;;) {
      const std::int64_t chunk = ClaimChunk(segment, tag, /*from_front=*/k == 0);
      if (chunk < 0) break;
      // Read the job before reporting the chunk done: after the last report the caller may start
      // the next job and overwrite it. The successful claim (acquire) saw Run's release of the
      // segment, stored after the job's fields.
      const std::uint32_t total = num_chunks_.load(std::memory_order_relaxed);
      const std::int64_t begin = chunk * chunk_;
      const std::int64_t end = std::min(n_, begin + chunk_);
      fn_(ctx_, slot, begin, end);
      const std::uint32_t finished = done_.fetch_add(1, std::memory_order_seq_cst) + 1;
      if (finished == total && caller_sleeping_.load(std::memory_order_seq_cst) != 0) {
        FutexWake(&done_, 1);
      }
    }
  }
}

void ThreadPool::WorkerLoop(int slot) noexcept {
  std::uint32_t seen = 0;
  for (;;) {
    // Wait for a new epoch: spin briefly (back-to-back jobs of one engine step), then sleep.
    const auto changed = [&] { return epoch_.load(std::memory_order_acquire) != seen; };
    if (!SpinUntil(changed, spin_ns_)) {
      sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
      while (epoch_.load(std::memory_order_seq_cst) == seen) FutexWait(&epoch_, seen);
      sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
    }
    // The epoch first, then stop_: the destructor stores stop_ before it bumps the epoch, so a
    // worker that reads the bumped epoch also reads stop_. (Read the other way round, a worker
    // woken by a job could miss stop_, then take the destructor's epoch as seen and sleep through
    // it: the join hung, ThreadPool.BackToBackJobsNeverRunAStaleChunk once in a fresh-clone CI.)
    seen = epoch_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    RunChunks(seen, slot);
  }
}

void ThreadPool::Run(std::int64_t n, std::int64_t min_items_per_chunk, ChunkFn fn,
                     void* ctx) noexcept {
  if (n <= 0) return;
  const std::int64_t min_chunk = std::max<std::int64_t>(1, min_items_per_chunk);
  // Up to kChunksPerThread chunks per thread: a chunk is the unit a descheduled thread can delay,
  // so a few per thread let the others absorb a stall, without cutting the work too fine.
  constexpr std::int64_t kChunksPerThread = 4;
  const std::int64_t max_chunks = static_cast<std::int64_t>(num_threads_) * kChunksPerThread;
  const std::int64_t want_chunks = std::min(max_chunks, n / min_chunk);
  if (num_threads_ <= 1 || want_chunks <= 1 || busy_.exchange(true, std::memory_order_acquire)) {
    inline_jobs_.fetch_add(1, std::memory_order_relaxed);
    fn(ctx, 0, 0, n);
    return;
  }
  parallel_jobs_.fetch_add(1, std::memory_order_relaxed);
  const std::int64_t chunk = (n + want_chunks - 1) / want_chunks;
  const std::uint32_t epoch = epoch_.load(std::memory_order_relaxed) + 1;
  const std::uint64_t tag = static_cast<std::uint64_t>(epoch) << 32;
  // Every segment of the previous job is exhausted (it finished) and tagged with its epoch, so a
  // worker still leaving it claims nothing whatever it reads: an old word has no chunk left, a new
  // one another epoch than the worker's. The job's fields are written before the segments are
  // published (release), and read by a thread only after a successful claim (acquire).
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  chunk_ = chunk;
  const auto total = static_cast<std::uint32_t>((n + chunk - 1) / chunk);
  num_chunks_.store(total, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  for (int s = 0; s < num_threads_; ++s) {
    const std::uint64_t front = std::uint64_t{total} * static_cast<std::uint64_t>(s) /
                                static_cast<std::uint64_t>(num_threads_);
    const std::uint64_t back = std::uint64_t{total} * static_cast<std::uint64_t>(s + 1) /
                               static_cast<std::uint64_t>(num_threads_);
    segments_[static_cast<std::size_t>(s)].word.store(tag | (front << kFieldBits) | back,
                                                      std::memory_order_release);
  }
  epoch_.store(epoch, std::memory_order_seq_cst);
  const int sleeping = sleeping_workers_.load(std::memory_order_seq_cst);
  if (sleeping > 0) {
    FutexWake(&epoch_, std::min<int>(sleeping, static_cast<int>(total) - 1));
  }

  RunChunks(epoch, 0);

  // Every chunk is claimed; wait for those other threads are still running.
  const auto all_done = [&] { return done_.load(std::memory_order_acquire) == total; };
  if (!SpinUntil(all_done, spin_ns_)) {
    caller_sleeping_.store(1, std::memory_order_seq_cst);
    for (std::uint32_t d = done_.load(std::memory_order_seq_cst); d != total;
         d = done_.load(std::memory_order_seq_cst)) {
      FutexWait(&done_, d);
    }
    caller_sleeping_.store(0, std::memory_order_relaxed);
  }
  busy_.store(false, std::memory_order_release);
}

}  // namespace metronome::base
