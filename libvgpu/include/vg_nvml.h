/*
 * vg_nvml.h - the subset of NVML that libvgpu and its fake use.
 *
 * Types, return codes and signatures are facts of NVIDIA's public ABI, taken from nvml.h
 * as shipped with the CUDA 12.x toolkit / GPU deployment kit (docs.nvidia.com/deploy/nvml-api).
 */
#ifndef VG_NVML_H
#define VG_NVML_H

#ifdef __cplusplus
extern "C" {
#endif

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct nvmlUtilization_st {
    unsigned int gpu;    /* percent of the last sample period a kernel was running */
    unsigned int memory;
} nvmlUtilization_t;

#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml##data##_v##ver##_t) | ((ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

/* X(name, parameter list, argument list): the NVML entry points libvgpu intercepts. */
#define VG_NVML_FUNCS(X)                                                                     \
    X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t dev, nvmlMemory_t *mem), (dev, mem))            \
    X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t dev, nvmlMemory_v2_t *mem), (dev, mem))

/* NVML entry points libvgpu calls but does not intercept. */
#define VG_NVML_USED(X)                                                                      \
    X(nvmlDeviceGetUUID, (nvmlDevice_t dev, char *uuid, unsigned int len), (dev, uuid, len))

#define VG_DECLARE(name, params, args) nvmlReturn_t name params;
VG_NVML_FUNCS(VG_DECLARE)
VG_NVML_USED(VG_DECLARE)
#undef VG_DECLARE

nvmlReturn_t nvmlInit(void);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *util);
const char *nvmlErrorString(nvmlReturn_t r);

#ifdef __cplusplus
}
#endif
#endif /* VG_NVML_H */
