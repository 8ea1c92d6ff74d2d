/*
 * vg_graph.c - graph memory: what a CUDA graph's memory nodes take.
 *
 * An allocation node (cuGraphAddMemAllocNode, cuGraphAddNode, or cuMemAllocAsync on a
 * capturing stream) takes no memory when it is made: the driver reserves it for the
 * executable graph and backs it when the graph runs, and keeps it with the graph (or the
 * device's graph memory pool) until the executable graph is destroyed or the pool is
 * trimmed. libvgpu charges an executable graph the sum of its graph's allocation nodes
 * when it is instantiated -- found by walking the graph's nodes, whichever way they were
 * added -- and gives it back when the executable graph is destroyed. Over the cap the
 * instantiation is refused with CUDA_ERROR_OUT_OF_MEMORY, the driver untouched. That is
 * conservative: memory a graph frees inside itself, or that graphs share, is charged per
 * executable graph for its lifetime.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vg_export.h"
#include "vg_hold.h"
#include "vg_real.h"
#include "vg_state.h"

/* Bytes of g's allocation nodes per card (bytes[card]); 0 when it has none or the driver
 * cannot list them (the instantiation then goes ahead uncharged). */
static uint64_t vg_graph_alloc_bytes(CUgraph g, uint64_t bytes[VG_MAX_CARDS]) {
    size_t n = 0;
    uint64_t total = 0;
    memset(bytes, 0, sizeof(uint64_t) * VG_MAX_CARDS);
    if (VG_CALL(cuGraphGetNodes, g, NULL, &n) != CUDA_SUCCESS || n == 0) return 0;
    CUgraphNode *nodes = calloc(n, sizeof *nodes);
    if (nodes == NULL) return 0;
    if (VG_CALL(cuGraphGetNodes, g, nodes, &n) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            CUgraphNodeType type = CU_GRAPH_NODE_TYPE_KERNEL;
            CUDA_MEM_ALLOC_NODE_PARAMS p;
            memset(&p, 0, sizeof p);
            if (nodes[i] == NULL || VG_CALL(cuGraphNodeGetType, nodes[i], &type) != CUDA_SUCCESS ||
                type != CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
                VG_CALL(cuGraphMemAllocNodeGetParams, nodes[i], &p) != CUDA_SUCCESS)
                continue;
            int card = p.poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE
                           ? vg_card_of_dev(p.poolProps.location.id)
                           : -1;
            if (card < 0) card = 0; /* a device outside the container: held against card 0's cap */
            bytes[card] = bytes[card] > UINT64_MAX - p.bytesize ? UINT64_MAX : bytes[card] + p.bytesize;
            total += p.bytesize;
        }
    }
    free(nodes);
    return total;
}

/* The key of an executable graph's charge on card in vg_execs. */
static uint64_t vg_exec_key(CUgraphExec e, int card) { return ((uint64_t)(uintptr_t)e << 4) | (uint64_t)card; }

/* Hold every card's share of the graph's memory, call the driver, keep or give back. */
#define VG_INSTANTIATE(name, params, args)                                                   \
    VG_EXPORT CUresult name params {                                                         \
        uint64_t bytes[VG_MAX_CARDS];                                                        \
        vg_hold h[VG_MAX_CARDS];                                                             \
        VG_GUARD();                                                                          \
        int charged = vg_g.mode == VG_MODE_ACTIVE && e != NULL && g != NULL &&               \
                      vg_graph_alloc_bytes(g, bytes) > 0;                                    \
        CUresult r = CUDA_SUCCESS;                                                           \
        int held = 0;                                                                        \
        for (; charged && held < VG_MAX_CARDS; held++) {                                     \
            r = vg_hold_card(bytes[held] ? held : -1, bytes[held], &h[held]);                \
            if (r != CUDA_SUCCESS) break;                                                    \
        }                                                                                    \
        if (r == CUDA_SUCCESS) r = VG_CALL(name, VG_UNPAREN args);                           \
        for (int c = 0; c < held; c++)                                                       \
            vg_hold_done(&h[c], r, &vg_execs, r == CUDA_SUCCESS ? vg_exec_key(*e, c) : 0);    \
        return r;                                                                            \
    }

VG_INSTANTIATE(cuGraphInstantiate, (CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n),
               (e, g, err, log, n))
VG_INSTANTIATE(cuGraphInstantiate_v2, (CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n),
               (e, g, err, log, n))
VG_INSTANTIATE(cuGraphInstantiateWithFlags, (CUgraphExec *e, CUgraph g, unsigned long long flags),
               (e, g, flags))
VG_INSTANTIATE(cuGraphInstantiateWithParams, (CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p),
               (e, g, p))
VG_INSTANTIATE(cuGraphInstantiateWithParams_ptsz,
               (CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p), (e, g, p))

VG_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
    vg_hold h[VG_MAX_CARDS];
    VG_GUARD();
    for (int c = 0; c < VG_MAX_CARDS; c++) vg_forget_begin(&vg_execs, vg_exec_key(e, c), &h[c]);
    CUresult r = VG_CALL(cuGraphExecDestroy, e);
    for (int c = 0; c < VG_MAX_CARDS; c++) vg_forget_end(&vg_execs, vg_exec_key(e, c), &h[c], r);
    return r;
}
