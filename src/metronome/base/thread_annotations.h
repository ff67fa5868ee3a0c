// Lock annotations the compiler checks: clang's thread-safety analysis (-Wthread-safety, enabled in
// the clang-tidy step of scripts/test.sh) proves that every member declared GUARDED_BY(mu) is
// touched only with mu held, and that functions declared REQUIRES(mu) are called with it held.
// Under other compilers the macros expand to nothing.
//
// libstdc++'s std::mutex and std::lock_guard carry no annotations, so the analysis cannot see
// them; shared state is therefore guarded by base::Mutex (a std::mutex declared a capability) and
// locked with base::MutexLock (a scoped capability). A condition variable waits on a MutexLock
// through std::condition_variable_any: MutexLock is BasicLockable.
#pragma once

#include <mutex>

#if defined(__clang__)
#define MTR_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define MTR_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) MTR_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY MTR_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) MTR_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) MTR_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) MTR_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) MTR_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) MTR_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) MTR_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RETURN_CAPABILITY(x) MTR_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS MTR_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace metronome::base {

// A std::mutex the analysis knows about. Same cost, same semantics.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds `mu` for its scope. lock()/unlock() let std::condition_variable_any release and retake it
// while waiting; the analysis treats the capability as held for the whole scope, which is what
// the waiting code may assume after the wait returns.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() RELEASE() { mu_->unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // For std::condition_variable_any only: the wait unlocks and relocks before it returns.
  void lock() NO_THREAD_SAFETY_ANALYSIS { mu_->lock(); }
  void unlock() NO_THREAD_SAFETY_ANALYSIS { mu_->unlock(); }

 private:
  Mutex* mu_;
};

}  // namespace metronome::base
