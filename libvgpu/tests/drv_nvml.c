/* drv_nvml.c - NVML (nvidia-smi, pynvml) reports the container's slice. */
#include <dlfcn.h>

#include "vg_nvml.h"
#include "vgt_drv.h"

static void memory_info_v1_and_v2_show_the_slice(void) {
    vgt_card c[2] = {{0, 512, 100, "fixed-share"}, {1, 1024, 50, "fixed-share"}};
    vgt_limits(2, c);
    vgt_ctx(1);
    CUdeviceptr p = 0;
    CHECK_RC(cuMemAlloc_v2(&p, 300 * VGT_MIB), CUDA_SUCCESS);
    CHECK_RC(nvmlInit_v2(), NVML_SUCCESS);
    nvmlDevice_t d0 = NULL, d1 = NULL;
    CHECK_RC(nvmlDeviceGetHandleByIndex_v2(0, &d0), NVML_SUCCESS);
    CHECK_RC(nvmlDeviceGetHandleByIndex_v2(1, &d1), NVML_SUCCESS);
    nvmlMemory_t m;
    CHECK_RC(nvmlDeviceGetMemoryInfo(d0, &m), NVML_SUCCESS);
    CHECK(m.total == 512 * VGT_MIB && m.used == 0 && m.free == 512 * VGT_MIB, "card 0: %llu/%llu", m.used, m.total);
    CHECK_RC(nvmlDeviceGetMemoryInfo(d1, &m), NVML_SUCCESS);
    CHECK(m.total == 1024 * VGT_MIB && m.used == 300 * VGT_MIB && m.free == 724 * VGT_MIB,
          "card 1: used %llu free %llu total %llu", m.used, m.free, m.total);
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    m2.version = nvmlMemory_v2;
    CHECK_RC(nvmlDeviceGetMemoryInfo_v2(d1, &m2), NVML_SUCCESS);
    CHECK(m2.total == 1024 * VGT_MIB && m2.used == 300 * VGT_MIB && m2.free == 724 * VGT_MIB && m2.reserved == 0,
          "v2 card 1: used %llu free %llu total %llu", m2.used, m2.free, m2.total);
}

static void odd_arguments_get_nvmls_answer(void) {
    vgt_card c = {0, 512, 100, "fixed-share"};
    vgt_limits(1, &c);
    nvmlDevice_t d0 = NULL;
    nvmlMemory_t m;
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    CHECK_RC(nvmlDeviceGetMemoryInfo(NULL, &m), NVML_ERROR_UNINITIALIZED);
    CHECK_RC(nvmlInit_v2(), NVML_SUCCESS);
    CHECK_RC(nvmlDeviceGetHandleByIndex_v2(0, &d0), NVML_SUCCESS);
    CHECK_RC(nvmlDeviceGetMemoryInfo(d0, NULL), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_RC(nvmlDeviceGetMemoryInfo(NULL, &m), NVML_ERROR_INVALID_ARGUMENT);
    m2.version = 1; /* wrong struct version */
    CHECK_RC(nvmlDeviceGetMemoryInfo_v2(d0, &m2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
}

static void nvidia_smi_style_dlsym(void) {
    /* nvidia-smi dlopens NVML and looks entry points up by name. */
    vgt_card c = {1, 2048, 100, "fixed-share"};
    vgt_limits(1, &c);
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    CHECK(h != NULL, "dlopen: %s", dlerror());
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2");
    nvmlReturn_t (*get)(unsigned, nvmlDevice_t *) = (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*info)(nvmlDevice_t, nvmlMemory_t *) = (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    CHECK(init && get && info, "lookups");
    nvmlDevice_t d = NULL;
    nvmlMemory_t m;
    CHECK_RC(init(), NVML_SUCCESS);
    CHECK_RC(get(1, &d), NVML_SUCCESS);
    CHECK_RC(info(d, &m), NVML_SUCCESS);
    CHECK(m.total == 2048 * VGT_MIB, "total %llu", m.total);
    CHECK_RC(get(0, &d), NVML_SUCCESS); /* a card the container does not hold */
    CHECK_RC(info(d, &m), NVML_SUCCESS);
    CHECK(m.total == 0 && m.free == 0, "foreign card shows %llu", m.total);
}

VGT_MAIN(VGT_CASE(memory_info_v1_and_v2_show_the_slice), VGT_CASE(odd_arguments_get_nvmls_answer),
         VGT_CASE(nvidia_smi_style_dlsym))
