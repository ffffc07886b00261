// The torch bridge: a reporter in torch's thread-local profiler slot that
// forwards every CUDA allocation and free of the threads it is installed on
// to the engine's sink, (where torch has it) a CUDA allocator trace tracker
// that hears every thread, and a CPU allocator of memlab's own that hears
// every thread's CPU allocations and frees.  Built against the torch the
// process imports; see pytest_memlab/engine/bridge_build.py.
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
#include <c10/core/CPUAllocator.h>
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
std::atomic<bool> g_cpu{false};           // CPU events are forwarded now
std::atomic<bool> g_cpu_own{false};       // ... by memlab's CPU allocator, else the reporter
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
  // allocator's reporting (a global mutex and a size table per event, on
  // the installed threads only): the path where memlab's own CPU allocator
  // could not be installed.
  bool memoryProfilingEnabled() const override;
};

std::shared_ptr<Reporter> g_reporter;

// Memlab's CPU allocator: torch's default allocator with one change, the
// deleter of each block allocated while CPU events are forwarded.  It hears
// every thread (the reporter hears only the threads it is installed on) for
// the cost of a virtual call and a deleter swap.  Delegating keeps the
// default's alignment, NUMA placement, fill and its profiler report (so
// torch.profiler's profile_memory still works inside a test).  Blocks keep
// the deleter they were made with, so installing and restoring never
// orphans one.  The object lives as long as the process: a storage keeps
// the allocator it was made with and grows through it.
// Written once, before the allocator is first published to c10 (a release
// fence there), read by its methods after they load the allocator's pointer.
c10::Allocator *g_default_cpu = nullptr;
c10::DeleterFnPtr g_default_cpu_free = nullptr;
int g_cpu_priority = -1;   // the priority it was installed at (c10 keeps it)

void cpu_free(void *ptr) {
  // Heard before the memory goes back: after it, another thread could be
  // given the same address and be heard allocating it first.
  if (ptr != nullptr && g_cpu.load(std::memory_order_relaxed)) {
    forward(MEMLAB_DEVICE_CPU, 0, ptr, -1, 0, 0, MEMLAB_SOURCE_REPORT);
  }
  g_default_cpu_free(ptr);
}

// Torch 1.x declares allocate const and has no copy_data; torch 2.x the
// reverse.  Both are declared without `override`: whichever matches the
// base class overrides it, the other is an unused overload.
struct CpuAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) const { return take(n); }
  c10::DataPtr allocate(size_t n) { return take(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &cpu_free; }
  void copy_data(void *dest, const void *src, std::size_t count) const {
    if (count > 0) std::memcpy(dest, src, count);
  }

 private:
  static c10::DataPtr take(size_t n) {
    std::atomic_thread_fence(std::memory_order_acquire);  // pairs with install's release
    c10::DataPtr dp;
    try {
      dp = g_default_cpu->allocate(n);
    } catch (...) {
      // The request the machine could not serve, heard before torch's
      // error goes up (a test that catches it is recorded all the same).
      if (g_cpu.load(std::memory_order_relaxed)) {
        forward(MEMLAB_DEVICE_CPU, 0, nullptr, static_cast<int64_t>(n), 0, 0,
                MEMLAB_SOURCE_FAILED);
      }
      throw;
    }
    // Only a block whose deleter is the default's own (its context is its
    // data) is taken over; any other would never be heard going, a false
    // leak, so it is not heard coming either.
    if (g_cpu.load(std::memory_order_relaxed) && dp.get() != nullptr &&
        dp.get() == dp.get_context() &&
        dp.compare_exchange_deleter(g_default_cpu_free, &cpu_free)) {
      forward(MEMLAB_DEVICE_CPU, 0, dp.get(), static_cast<int64_t>(n), 0, 0,
              MEMLAB_SOURCE_REPORT);
    }
    return dp;
  }
};

std::atomic<CpuAllocator *> g_cpu_allocator{nullptr};

// The reporter hears the CPU where memlab's allocator does not: not
// installed, or set aside since by another (the mobile allocator a test
// sets): one load of c10's allocator slot, on the reporter's threads only.
bool Reporter::memoryProfilingEnabled() const {
  if (!g_cpu.load(std::memory_order_relaxed)) return false;
  if (!g_cpu_own.load(std::memory_order_relaxed)) return true;
  return c10::GetCPUAllocator() != g_cpu_allocator.load(std::memory_order_relaxed);
}

// c10 keeps a priority per device type and ignores a SetCPUAllocator below
// it, and the priority can be neither read nor lowered.  Trying 0, 1, ...
// finds it without raising it: every try below it is ignored.
int set_cpu_allocator_at_its_priority(c10::Allocator *allocator, int from) {
  for (int p = from < 0 ? 0 : from; p < 256; ++p) {
    c10::SetCPUAllocator(allocator, static_cast<uint8_t>(p));
    if (c10::GetCPUAllocator() == allocator) return p;
  }
  return -1;
}

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

int memlab_bridge_install_cpu_allocator(char *err, size_t errlen) {
  try {
    CpuAllocator *ours = g_cpu_allocator.load();
    if (ours != nullptr && c10::GetCPUAllocator() == ours) {
      g_cpu_own.store(true, std::memory_order_relaxed);
      return 0;
    }
    g_cpu_own.store(false, std::memory_order_relaxed);
    c10::Allocator *current = c10::GetCPUAllocator();
    c10::Allocator *def = c10::GetDefaultCPUAllocator();
    if (current != def) {
      set_error(err, errlen,
                "another CPU allocator than torch's default is set (the mobile "
                "allocator, or one of the process's own)");
      return 1;
    }
    if (ours == nullptr) {
      g_default_cpu = def;
      g_default_cpu_free = def->raw_deleter();
      if (g_default_cpu_free == nullptr) {
        set_error(err, errlen, "torch's default CPU allocator has no deleter to take over");
        return 1;
      }
      ours = new CpuAllocator();  // never freed: see above
      // c10's slot is a plain pointer: the fence orders the two pointers
      // above before it, for threads that allocate through it at once.
      std::atomic_thread_fence(std::memory_order_release);
      g_cpu_allocator.store(ours);
    }
    int priority = set_cpu_allocator_at_its_priority(ours, 0);
    if (priority < 0) {
      set_error(err, errlen, "c10 did not take the allocator at any priority");
      return -1;
    }
    g_cpu_priority = priority;
    g_cpu_own.store(true, std::memory_order_relaxed);
    return 0;
  } catch (const std::exception &e) {
    set_error(err, errlen, e.what());
  } catch (...) {
    set_error(err, errlen, "unknown C++ exception installing the CPU allocator");
  }
  return -1;
}

int memlab_bridge_restore_cpu_allocator(void) {
  try {
    // The reporter path until the next install: blocks of memlab's
    // allocator still free through it, heard while CPU events are on.
    g_cpu_own.store(false, std::memory_order_relaxed);
    CpuAllocator *ours = g_cpu_allocator.load();
    if (ours == nullptr || c10::GetCPUAllocator() != ours) {
      return 1;  // not installed, or set aside since (its blocks still free through it)
    }
    return set_cpu_allocator_at_its_priority(g_default_cpu, g_cpu_priority) < 0 ? -1 : 0;
  } catch (...) {
    return -1;
  }
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
