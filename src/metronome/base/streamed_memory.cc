#include "metronome/base/streamed_memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <fstream>

namespace metronome::base {
namespace {

constexpr std::size_t kLineBytes = 64;
// Huge page sizes this rule applies to: x86-64's 2 MiB, arm64's 2 MiB (4 KiB base pages) or
// 32 MiB (16 KiB). arm64 with 64 KiB base pages has 512 MiB PMD pages: rounding every buffer up to
// that wastes more than the TLB saves, so such a size is not used.
constexpr std::size_t kMinHugePageBytes = std::size_t{4} << 10;
constexpr std::size_t kMaxHugePageBytes = std::size_t{32} << 20;

bool UsesHugePages(std::size_t bytes, std::size_t huge_page_bytes) {
  return huge_page_bytes >= kMinHugePageBytes && huge_page_bytes <= kMaxHugePageBytes &&
         bytes >= huge_page_bytes;
}

std::size_t RoundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::size_t TransparentHugePageBytes() {
  static const std::size_t bytes = [] {
    std::ifstream in("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
    std::size_t value = 0;
    if (!(in >> value)) return std::size_t{0};
    return value;
  }();
  return bytes;
}

std::size_t StreamedAllocationBytes(std::size_t bytes, std::size_t huge_page_bytes) {
  if (bytes == 0) bytes = 1;
  return UsesHugePages(bytes, huge_page_bytes) ? RoundUp(bytes, huge_page_bytes)
                                               : RoundUp(bytes, kLineBytes);
}

void StreamedFree::operator()(std::byte* p) const noexcept { std::free(p); }

StreamedBuffer AllocateStreamed(std::size_t bytes) {
  const std::size_t huge = TransparentHugePageBytes();
  const std::size_t size = StreamedAllocationBytes(bytes, huge);
  if (!UsesHugePages(bytes, huge)) {
    return StreamedBuffer(static_cast<std::byte*>(std::aligned_alloc(kLineBytes, size)));
  }
  StreamedBuffer mem(static_cast<std::byte*>(std::aligned_alloc(huge, size)));
  // Advice only, before the first touch, so those pages are faulted in huge (a failure, e.g. on a
  // kernel built without transparent huge pages, leaves ordinary pages). Only the huge pages the
  // caller's bytes fill: the last, partial one stays in ordinary pages, resident only as far as
  // it is touched, so the rounding costs address space, not memory.
  const std::size_t whole = bytes / huge * huge;
  if (mem != nullptr) (void)::madvise(mem.get(), whole, MADV_HUGEPAGE);
  return mem;
}

}  // namespace metronome::base
