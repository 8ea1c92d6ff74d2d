/*
 * fakecuda.h - test-only controls of the fake libcuda.so.1 / libnvidia-ml.so.1.
 *
 * The fake simulates devices (FAKECUDA_DEVICES, default 2) with FAKECUDA_MEM_MIB of memory
 * each (default 16384) and kernels that occupy a device for a given time: a function
 * named "busy_<ns>" runs for <ns> nanoseconds on a per-device timeline. Launches are
 * asynchronous up to FAKECUDA_QUEUE_NS of queued work (default 30 ms), then block, as a
 * real driver's full push buffer does. With FAKECUDA_SHARED=<file>, processes naming the
 * same file share the devices' timelines (kernels of all of them take turns). Device
 * UUIDs are GPU-face0000-0000-0000-0000-0000000000NN (NN = ordinal in hex), or, with
 * NVIDIA_VISIBLE_DEVICES=<uuid>,..., exactly the listed cards in that order. With
 * FAKECUDA_DEVICE_DIR=<dir> each visible card is the file <dir>/<uuid>, shared by every
 * process on the node that sees the card (memory, timeline, and a per-process memory
 * table the node agent reads as it would NVML's). Not part of libvgpu.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stdint.h>

/* Simulated GPU time of device dev that falls inside [t0, t1] (CLOCK_MONOTONIC ns). */
uint64_t fakecuda_busy_between(int dev, uint64_t t0, uint64_t t1);
/* The same, counting only kernels launched by process pid. */
uint64_t fakecuda_busy_between_pid(int dev, uint64_t t0, uint64_t t1, int pid);
/* Device memory allocated on dev now, and the most ever allocated at once. */
uint64_t fakecuda_used(int dev);
uint64_t fakecuda_peak(int dev);
/* Calls that reached the fake: allocations (all paths) and context synchronisations. */
uint64_t fakecuda_alloc_calls(void);
uint64_t fakecuda_sync_calls(void);
uint64_t fakecuda_launches(int dev);

#endif /* FAKECUDA_H */
