// The torch bridge: a reporter in torch's thread-local profiler slot that
// forwards every CPU and CUDA allocation and free to the engine's sink, and
// (where torch has it) a CUDA allocator trace tracker that hears the threads
// the thread-local reporter does not.  Built against the torch the process
// imports; see pytest_memlab/_bridge_build.py.
//
// Why a ProfilerStateBase and not a bare c10::MemoryReportingInfoBase: the
// allocators only need the latter, but torch reads the PROFILER_STATE slot as
// a ProfilerStateBase everywhere else (profilerEnabled(), getProfilerConfig(),
// called by autograd.Function.apply on every call).  A bare reporter there is
// read past its end: a garbage config, a profiler that seems on, and
// std::bad_array_new_length out of Function.apply when the heap happened to
// hold the wrong bytes.  As a ProfilerStateBase with a disabled config, torch
// sees no profiler, and torch.profiler can still be started on top of it.
//
// Both callbacks run inside the allocators, the CUDA one under the
// allocator's lock: they call the sink and nothing else.

#include "memlab_bridge.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#ifdef MEMLAB_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <type_traits>

namespace {

std::atomic<memlab_sink_fn> g_sink{nullptr};
std::atomic<void *> g_ctx{nullptr};
std::atomic<bool> g_cpu{false};
std::atomic<bool> g_tracker_on{false};
std::atomic<bool> g_tracker_attached{false};


void set_error(char *err, size_t errlen, const char *what) {
  if (err != nullptr && errlen > 0) {
    std::snprintf(err, errlen, "%s", what);
  }
}

inline void forward(int type, int index, void *ptr, int64_t size,
                    uint64_t total, uint64_t reserved, int source) {
  memlab_sink_fn sink = g_sink.load(std::memory_order_acquire);
  if (sink != nullptr) {
    sink(g_ctx.load(std::memory_order_relaxed), type, index, ptr, size, total,
         reserved, source);
  }
}

// Torch 1.x declares the totals int64_t, torch 2.x size_t.  Declaring both
// overloads without `override` compiles against either: the one that matches
// the base class overrides it, the other is an unused overload.
namespace tpi = torch::profiler::impl;

struct Reporter final : public tpi::ProfilerStateBase {
  Reporter() : tpi::ProfilerStateBase(tpi::ProfilerConfig(tpi::ProfilerState::Disabled)) {}
  tpi::ActiveProfilerType profilerType() override {
    return tpi::ActiveProfilerType::NONE;
  }
  void reportMemoryUsage(void *ptr, int64_t alloc_size, size_t total_allocated,
                         size_t total_reserved, c10::Device device) {
    forward(static_cast<int>(device.type()), device.index(), ptr, alloc_size,
            static_cast<uint64_t>(total_allocated),
            static_cast<uint64_t>(total_reserved), MEMLAB_SOURCE_REPORT);
  }
  void reportMemoryUsage(void *ptr, int64_t alloc_size, int64_t total_allocated,
                         int64_t total_reserved, c10::Device device) {
    forward(static_cast<int>(device.type()), device.index(), ptr, alloc_size,
            static_cast<uint64_t>(total_allocated),
            static_cast<uint64_t>(total_reserved), MEMLAB_SOURCE_REPORT);
  }
  // false still delivers every CUDA event; true also turns on the CPU
  // allocator's reporting.
  bool memoryProfilingEnabled() const override {
    return g_cpu.load(std::memory_order_relaxed);
  }
};

std::shared_ptr<Reporter> g_reporter;

}  // namespace

extern "C" {

int memlab_bridge_abi(void) { return MEMLAB_BRIDGE_ABI; }

int memlab_bridge_install(memlab_sink_fn sink, void *ctx, char *err,
                          size_t errlen) {
  try {
    g_ctx.store(ctx, std::memory_order_relaxed);
    g_sink.store(sink, std::memory_order_release);
    if (!g_reporter) {
      g_reporter = std::make_shared<Reporter>();
    }
    auto *current = c10::ThreadLocalDebugInfo::get(
        c10::DebugInfoKind::PROFILER_STATE);
    if (current == g_reporter.get()) {
      return 0;
    }
    c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE,
                                     g_reporter);
    return 0;
  } catch (const std::exception &e) {
    set_error(err, errlen, e.what());
  } catch (...) {
    set_error(err, errlen, "unknown C++ exception in memlab_bridge_install");
  }
  return -1;
}

int memlab_bridge_uninstall(char *err, size_t errlen) {
  try {
    auto *current = c10::ThreadLocalDebugInfo::get(
        c10::DebugInfoKind::PROFILER_STATE);
    if (g_reporter && current == g_reporter.get()) {
      c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
    }
    return 0;
  } catch (const std::exception &e) {
    set_error(err, errlen, e.what());
  } catch (...) {
    set_error(err, errlen, "unknown C++ exception in memlab_bridge_uninstall");
  }
  return -1;
}

int memlab_bridge_installed(void) {
  try {
    return g_reporter && c10::ThreadLocalDebugInfo::get(
                             c10::DebugInfoKind::PROFILER_STATE) == g_reporter.get();
  } catch (...) {
    return 0;
  }
}

void memlab_bridge_set_cpu(int on) {
  g_cpu.store(on != 0, std::memory_order_relaxed);
}

void memlab_bridge_set_tracker(int on) {
  g_tracker_on.store(on != 0, std::memory_order_relaxed);
}

int memlab_bridge_cuda_totals(int device, int64_t *allocated, int64_t *reserved) {
#ifdef MEMLAB_WITH_CUDA
  try {
    // The caching allocator's own counters, read under its lock: what
    // torch.cuda.memory_allocated and memory_reserved return, without the
    // whole statistics dictionary they build and flatten in Python.
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(device));
    *allocated = static_cast<int64_t>(stats.allocated_bytes[0].current);
    *reserved = static_cast<int64_t>(stats.reserved_bytes[0].current);
    return 0;
  } catch (...) {
    return -1;
  }
#else
  (void)device;
  (void)allocated;
  (void)reserved;
  return 1;
#endif
}

int memlab_bridge_attach_cuda_tracker(char *err, size_t errlen) {
#ifdef MEMLAB_WITH_CUDA
  try {
    if (g_tracker_attached.exchange(true)) {
      return 0;
    }
    namespace cca = c10::cuda::CUDACachingAllocator;
    cca::attachAllocatorTraceTracker([](const cca::TraceEntry &te) {
      if (!g_tracker_on.load(std::memory_order_relaxed)) {
        return;
      }
      void *ptr = reinterpret_cast<void *>(te.addr_);
      switch (te.action_) {
        case cca::TraceEntry::ALLOC: {
          // size_ is the requested size; the allocator rounds blocks up to
          // 512 bytes.  The report that follows on a reporting thread
          // replaces this estimate with the exact block size.
          uint64_t rounded = ((static_cast<uint64_t>(te.size_) + 511) / 512) * 512;
          if (rounded == 0) rounded = 512;
          forward(MEMLAB_DEVICE_CUDA, te.device_, ptr, static_cast<int64_t>(rounded), 0, 0,
                  MEMLAB_SOURCE_TRACE);
          break;
        }
        case cca::TraceEntry::FREE_REQUESTED:
          forward(MEMLAB_DEVICE_CUDA, te.device_, ptr, -1, 0, 0, MEMLAB_SOURCE_TRACE);
          break;
        default:
          break;
      }
    });
    return 0;
  } catch (const std::exception &e) {
    g_tracker_attached.store(false);
    set_error(err, errlen, e.what());
  } catch (...) {
    g_tracker_attached.store(false);
    set_error(err, errlen, "unknown C++ exception attaching the tracker");
  }
  return -1;
#else
  set_error(err, errlen, "this bridge was built without CUDA");
  return 1;
#endif
}

}  // extern "C"
