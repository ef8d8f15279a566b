// ParallelFor: the one way maxfx's CPU kernels spread work over XLA's thread pool.
#ifndef MAXFX_CUSTOM_CALLS_CPU_PARALLEL_H_
#define MAXFX_CUSTOM_CALLS_CPU_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace maxfx_cpu {

// The chunks of one call, shared with the pool's helpers. Helpers hold it by
// shared_ptr: one that starts after the call returned finds no chunk left and
// exits without touching the caller's stack (fn is only used for a chunk won
// from `next`, and the caller waits for every chunk won to finish).
template <typename Fn>
struct Chunks {
  const Fn* fn;
  int64_t n, per, count;
  std::atomic<int64_t> next{0}, done{0};

  // Runs chunks until none is left to take.
  void Work() {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < count; c = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t end = std::min(n, (c + 1) * per);
      for (int64_t i = c * per; i < end; ++i) (*fn)(i);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Runs fn(i) for i in [0, n) on the calling thread and XLA's thread pool
// (the handler's ThreadPool context, so no second pool competes for the cores);
// returns when every i is done. Items go in chunks of at least `min_per_chunk`,
// a few per worker, taken first come, first served: on a shared machine a
// helper that starts late (its core busy with another thunk or process) takes
// fewer chunks, and the caller never waits for a helper that has not started.
// `parallel` false (work too small to be worth waking a helper: ~20 us) runs
// everything on the calling thread.
template <typename Fn>
void ParallelFor(xla::ffi::ThreadPool pool, int64_t n, int64_t min_per_chunk, bool parallel, const Fn& fn) {
  constexpr int64_t kChunksPerWorker = 4;
  const int64_t workers = parallel ? std::max<int64_t>(1, pool.num_threads()) : 1;
  const int64_t count = std::clamp<int64_t>(n / std::max<int64_t>(1, min_per_chunk), 1, workers * kChunksPerWorker);
  if (count == 1 || workers == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto chunks = std::make_shared<Chunks<Fn>>();
  chunks->fn = &fn;
  chunks->n = n;
  chunks->per = (n + count - 1) / count;
  chunks->count = count;
  for (int64_t h = 1; h < std::min(workers, count); ++h) pool.Schedule([chunks] { chunks->Work(); });
  chunks->Work();
  while (chunks->done.load(std::memory_order_acquire) < count) std::this_thread::yield();
}

}  // namespace maxfx_cpu

#endif  // MAXFX_CUSTOM_CALLS_CPU_PARALLEL_H_
