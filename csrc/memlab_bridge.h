/* The torch bridge's whole interface.  Everything behind it is C++ against
 * the c10 headers; nothing C++ crosses this line: every entry catches every
 * exception and reports it as a return code and a message in err.
 *
 * Return codes: 0 ok, 1 not available in this torch build, -1 error.
 */
#ifndef MEMLAB_BRIDGE_H
#define MEMLAB_BRIDGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MEMLAB_BRIDGE_ABI 2

/* Where an event came from (the sink's source argument). */
#define MEMLAB_SOURCE_REPORT 0  /* the thread-local reporter: exact block size */
#define MEMLAB_SOURCE_TRACE 1   /* the CUDA trace tracker: requested size, any thread */
#define MEMLAB_SOURCE_FAILED 2  /* memlab's CPU allocator: a request torch's could not serve
                                   (ptr NULL, size the request), before the error is raised */
/* c10::DeviceType values the engine measures (the sink's device_type). */
#define MEMLAB_DEVICE_CPU 0
#define MEMLAB_DEVICE_CUDA 1

/* The bridge is built with hidden visibility; only these entries show. */
#if defined(__GNUC__)
#define MEMLAB_BRIDGE_API __attribute__((visibility("default")))
#else
#define MEMLAB_BRIDGE_API
#endif

/* Engine_sink (engine.h); engine.c fails to build if the two drift apart. */
typedef void (*memlab_sink_fn)(void *ctx, int device_type, int device_index,
                               void *ptr, int64_t size, uint64_t total,
                               uint64_t reserved, int source);

MEMLAB_BRIDGE_API int memlab_bridge_abi(void);
/* Pushes the reporter as thread-local debug info on the calling thread; the
 * autograd engine carries it into its device threads. */
MEMLAB_BRIDGE_API int memlab_bridge_install(memlab_sink_fn sink, void *ctx, char *err,
                          size_t errlen);
/* Pops it again if it is still the innermost profiler state. */
MEMLAB_BRIDGE_API int memlab_bridge_uninstall(char *err, size_t errlen);
/* 1 when the calling thread's innermost profiler state is the reporter. */
MEMLAB_BRIDGE_API int memlab_bridge_installed(void);
/* CPU allocations and frees are forwarded only while this is on: by
 * memlab's CPU allocator where it is installed (every thread), else by the
 * reporter (the installed threads; it costs torch's CPU allocator a lock and
 * a hash update per event). */
MEMLAB_BRIDGE_API void memlab_bridge_set_cpu(int on);
/* Makes memlab's CPU allocator c10's CPU allocator: torch's default one that
 * also forwards its events while set_cpu is on.  1 (and why, in err) where
 * another allocator than the default is set; -1 on error. */
MEMLAB_BRIDGE_API int memlab_bridge_install_cpu_allocator(char *err, size_t errlen);
/* Gives c10 its default CPU allocator back, at the priority it had, if
 * memlab's is still the one set (1 where it is not).  Blocks allocated
 * through memlab's still free through it. */
MEMLAB_BRIDGE_API int memlab_bridge_restore_cpu_allocator(void);
/* Attaches a CUDA allocator trace tracker (once; there is no detach), after
 * CUDA is initialised.  1 when this torch has none or CUDA is absent. */
MEMLAB_BRIDGE_API int memlab_bridge_attach_cuda_tracker(char *err, size_t errlen);
/* The CUDA caching allocator's allocated and reserved bytes on a device
 * (index 0 of its statistics: all pools), as torch.cuda.memory_allocated
 * and memory_reserved give them; 1 without CUDA, -1 on error.  Call it only
 * once CUDA is initialised. */
MEMLAB_BRIDGE_API int memlab_bridge_cuda_totals(int device, int64_t *allocated, int64_t *reserved);
/* Gates the tracker's forwarding without detaching it. */
MEMLAB_BRIDGE_API void memlab_bridge_set_tracker(int on);

#ifdef __cplusplus
}
#endif

#endif
