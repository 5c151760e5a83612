// ---- PTX wrappers, sm_90a: mbarrier, TMA, bulk stores, clusters, setmaxnreg, wgmma ----
#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

__device__ __forceinline__ void gg_bar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the other threads and to the TMA unit.
__device__ __forceinline__ void gg_fence_barrier_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Waits until the barrier's phase of the given parity has completed.
__device__ __forceinline__ void gg_bar_wait(unsigned bar, unsigned parity)
{
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n"
                 "}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void gg_bar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives on the barrier at the same offset in the shared memory of cluster block `rank`.
__device__ __forceinline__ void gg_bar_arrive_remote(unsigned bar, unsigned rank)
{
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
    // the default .release.cta: a .cluster-scope release fence here stalled each k tile (2x slower)
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// Arrives and announces `bytes` of TMA traffic: the phase completes when they have all landed.
__device__ __forceinline__ void gg_bar_expect(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Named barrier `id` among THREADS threads (a multiple of 32): every one waits, or arrives only.
template <int THREADS>
__device__ __forceinline__ void gg_named_sync(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory"); }
template <int THREADS>
__device__ __forceinline__ void gg_named_arrive(int id) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory"); }

// Release / acquire of a flag in global memory, GPU scope.
__device__ __forceinline__ void gg_st_release(unsigned* p, unsigned v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned gg_ld_acquire(const unsigned* p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void gg_prefetch_map(const CUtensorMap* map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// One box of the tensor map at element coordinates (inner, outer) -> shared memory at dst,
// completing on bar. Elements outside the matrix arrive as zeros.
__device__ __forceinline__ void gg_tma_load(unsigned dst, const CUtensorMap* map, int inner, int outer, unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3 }], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(bar) : "memory");
}
// gg_tma_load, written into the shared memory of every block of the cluster in `mask` (same
// offset), each block's barrier at offset bar counting the bytes it receives.
__device__ __forceinline__ void gg_tma_load_multicast(unsigned dst, const CUtensorMap* map, int inner, int outer,
                                                      unsigned bar, unsigned short mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, { %2, %3 }], [%4], %5;\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(bar), "h"(mask)
                 : "memory");
}

// The same for a 3-D tensor map (a strided batch of matrices, the batch outermost): the box at
// (inner, outer) of matrix `batch`.
__device__ __forceinline__ void gg_tma_load_3d(unsigned dst, const CUtensorMap* map, int inner, int outer, int batch,
                                               unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3, %4 }], [%5];\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(batch), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void gg_tma_load_multicast_3d(unsigned dst, const CUtensorMap* map, int inner, int outer,
                                                         int batch, unsigned bar, unsigned short mask)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, { %2, %3, %4 }], [%5], %6;\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(batch), "r"(bar),
                   "h"(mask)
                 : "memory");
}

__device__ __forceinline__ void gg_st_shared_v2(unsigned addr, float x, float y)
{
    asm volatile("st.shared.v2.f32 [%0], { %1, %2 };\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void gg_st_shared_b32(unsigned addr, unsigned x)
{
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}
__device__ __forceinline__ unsigned gg_lds32(unsigned addr)
{
    unsigned v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
// Makes this thread's shared-memory writes visible to the async proxy (the TMA unit's reads).
__device__ __forceinline__ void gg_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// One box of shared memory at src -> the tensor map's matrix at element coordinates (inner,
// outer), in this thread's current bulk group; the parts outside the matrix are not written.
__device__ __forceinline__ void gg_tma_store(unsigned src, const CUtensorMap* map, int inner, int outer)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, { %1, %2 }], [%3];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(src) : "memory");
}
// gg_tma_store into matrix `batch` of a 3-D tensor map.
__device__ __forceinline__ void gg_tma_store_3d(unsigned src, const CUtensorMap* map, int inner, int outer, int batch)
{
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, { %1, %2, %3 }], [%4];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(batch), "r"(src) : "memory");
}
__device__ __forceinline__ void gg_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's bulk groups are still reading their shared memory.
template <int N>
__device__ __forceinline__ void gg_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
// Waits until at most N of this thread's bulk groups are not complete (written to global memory).
template <int N>
__device__ __forceinline__ void gg_bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ unsigned gg_cluster_rank()
{
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}
// Every thread of every block of the cluster: what each did before is visible to all after.
__device__ __forceinline__ void gg_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

template <int REGS>
__device__ __forceinline__ void gg_setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void gg_setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS)); }

// wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets (K-major: LBO unused, SBO = 8 rows of 128 bytes; MN-major, read with wgmma's
// transpose bit: LBO = the distance between 64-column chunks, SBO = 8 k-rows of 128 bytes).
// Adding (bytes >> 4) moves the start.
__device__ __forceinline__ uint64_t gg_wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}
__device__ __forceinline__ void gg_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void gg_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gg_wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keeps the compiler from touching the accumulators before the wgmma that writes them is done.
template <int N>
__device__ __forceinline__ void gg_fence_registers(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i)
        asm volatile("" : "+f"(r[i])::"memory");
}
