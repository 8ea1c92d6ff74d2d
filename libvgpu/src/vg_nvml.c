/*
 * vg_nvml.c - NVML's memory view shows the container's slice, so nvidia-smi, pynvml and
 * frameworks that ask NVML see the cap as the card's total and the container's
 * accounted use as "used". Cards are matched by UUID.
 */
#include <string.h>

#include "vg_export.h"
#include "vg_real.h"
#include "vg_state.h"

/* The container's card for an NVML handle: 0 and *card (-1: not the container's), or -1
 * when libvgpu is not enforcing. */
static int vg_nvml_card(nvmlDevice_t dev, int *card) {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (vg_g.mode != VG_MODE_ACTIVE) return -1;
    if (VG_NVCALL(nvmlDeviceGetUUID, dev, uuid, sizeof uuid) != NVML_SUCCESS) return -1;
    uuid[sizeof uuid - 1] = '\0';
    *card = vg_card_of_uuid(uuid);
    return 0;
}

static void vg_nvml_slice(int card, unsigned long long *total, unsigned long long *used,
                          unsigned long long *free_b) {
    uint64_t cap = card >= 0 ? vg_g.limits.cards[card].memory_bytes : 0;
    uint64_t u = card >= 0 ? vg_region_card_used(vg_g.region, card) : 0;
    if (u > cap) u = cap;
    *total = cap;
    *used = u;
    *free_b = cap - u;
}

VG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem) {
    if (vg_init() == VG_MODE_BROKEN) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = VG_NVCALL(nvmlDeviceGetMemoryInfo, dev, mem);
    int card = -1;
    if (r == NVML_SUCCESS && vg_nvml_card(dev, &card) == 0)
        vg_nvml_slice(card, &mem->total, &mem->used, &mem->free);
    return r;
}

VG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem) {
    if (vg_init() == VG_MODE_BROKEN) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = VG_NVCALL(nvmlDeviceGetMemoryInfo_v2, dev, mem);
    int card = -1;
    if (r == NVML_SUCCESS && vg_nvml_card(dev, &card) == 0) {
        vg_nvml_slice(card, &mem->total, &mem->used, &mem->free);
        mem->reserved = 0;
    }
    return r;
}
