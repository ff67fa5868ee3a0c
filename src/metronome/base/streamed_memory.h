// Memory for the large, long-lived buffers every step streams through: the weights (placed by
// model::ModelWeights::PlaceForKernels), an fp32 model's arena, the KV pool. At a few hundred MB
// per step a 4 KiB page is a TLB miss and a hardware-prefetch restart every 4 KiB (the L2 stream
// prefetcher does not cross a page); backed by transparent huge pages the same stream has a miss
// per 2 MiB (bench-decode at one session, every stored type; docs/performance.md, "Resident
// memory").
//
// A buffer of at least one huge page is aligned to the huge page size and advised to the kernel
// as huge-page memory (madvise MADV_HUGEPAGE: honoured when transparent huge pages are "always" or
// "madvise", the Linux default; ignored with "never", or where the call does not exist); smaller
// ones are only cache-line aligned. The huge pages the buffer's bytes fill are advised; a last,
// partial one stays in ordinary pages (its rounding up is address space, not resident memory).
#pragma once

#include <cstddef>
#include <memory>

namespace metronome::base {

// The kernel's transparent huge page size in bytes (/sys/kernel/mm/transparent_hugepage/
// hpage_pmd_size), read once; 0 where transparent huge pages are not available.
[[nodiscard]] std::size_t TransparentHugePageBytes();

// The size AllocateStreamed(bytes) allocates: bytes rounded up to 64, or to a whole number of huge
// pages when huge pages apply (TransparentHugePageBytes() in [4 KiB, 32 MiB] and bytes at least
// one). Pure given huge_page_bytes; for callers that report what they hold, and for tests.
[[nodiscard]] std::size_t StreamedAllocationBytes(std::size_t bytes, std::size_t huge_page_bytes);

// Owns a buffer from AllocateStreamed (std::aligned_alloc memory, released with std::free).
struct StreamedFree {
  void operator()(std::byte* p) const noexcept;
};
using StreamedBuffer = std::unique_ptr<std::byte, StreamedFree>;

// Uninitialised memory of at least `bytes` (StreamedAllocationBytes of them) for a streamed
// buffer; null when the allocation fails.
[[nodiscard]] StreamedBuffer AllocateStreamed(std::size_t bytes);

}  // namespace metronome::base
