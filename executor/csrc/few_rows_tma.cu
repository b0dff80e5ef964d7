// The few-row matmul with its weights streamed by the bulk copy engine: out = x @ w.T for up to 16 rows of x,
// optionally with the SwiGLU of a fused gate/up projection in the epilogue. Launched by executor/few_rows_tma.py.
//
// Why: a Triton kernel restarts its software pipeline in every program and keeps a few KB of weights in flight per
// SM, so a small projection spends much of its time filling and draining (Ouro-1.4B's O projection, 8 MB, took
// 5.4 us against 2 us of reads). Here each CTA owns a run of 16-row weight units and one warp streams all of them
// through a ring of shared-memory stages with cp.async.bulk (one copy per weight row and stage, completing on an
// mbarrier), so up to `stages` x 8 KB per SM are in flight and the stream never restarts between units. The copies
// start before griddepcontrol.wait: under programmatic dependent launch the weights, which never depend on the
// kernel before, stream in under that kernel's tail, and only the consumers wait before reading x.
//
// Arithmetic: mma.sync m16n8k16 (bf16 in, fp32 accumulate) with the weights as A (16 output columns; with SwiGLU 8
// gate and the same 8 up columns) and x as B (8 rows, two MMAs for 9-16 rows). A lane's k slots are mapped onto 16
// consecutive columns of its own (k = 16 q + 4 j + {0,1,2,3} for MMA step j of lane group q), the same map for A
// and B, so each lane reads its weights as two 16-byte shared loads per row and its x as two 16-byte global loads.
// Each of the four consumer warps owns a quarter of every stage's columns; their partial sums meet in shared
// memory once per unit.
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

constexpr int KC = 256;                  // K columns per stage
constexpr int UNIT_ROWS = 16;            // weight rows per stage: one MMA's M
constexpr int ROW_STRIDE = KC * 2 + 16;  // bytes per row in shared memory; the pad keeps 16-byte reads conflict free
constexpr int STAGE_BYTES = UNIT_ROWS * ROW_STRIDE;
constexpr int CONSUMER_WARPS = 4;
constexpr int THREADS = (CONSUMER_WARPS + 1) * 32;
constexpr int K_PER_WARP = KC / CONSUMER_WARPS;  // 64 columns: 16 per lane group

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT;\n}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void wait_for_predecessor() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void let_successor_launch() { asm volatile("griddepcontrol.launch_dependents;" :::); }

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(CONSUMER_WARPS * 32)); }

__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

// x's 16 columns [col, col + 16) of row `row` as eight bf16 pairs (zero past the rows or columns).
template <int NT>
__device__ __forceinline__ void load_x(uint4 (&dst)[NT][2], const __nv_bfloat16* __restrict__ x, int m, int k,
                                       int g, int col) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int row = g + 8 * nt;
    if (row < m && col < k) {
      const uint4* p = reinterpret_cast<const uint4*>(x + static_cast<size_t>(row) * k + col);
      dst[nt][0] = __ldg(p);
      dst[nt][1] = __ldg(p + 1);
    } else {
      dst[nt][0] = dst[nt][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

// trigger: 0 never lets the successor launch early, 1 once the producer has issued its last copy, 2 once the
// consumers are past their last stage (before the last unit's reduction and stores).
template <int NT, bool SWIGLU>
__device__ __forceinline__ void few_rows_tma(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                             __nv_bfloat16* __restrict__ out, int m, int n, int k, int stages,
                                             int trigger) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  float* partial = reinterpret_cast<float*>(smem + stages * STAGE_BYTES);
  uint64_t* full = reinterpret_cast<uint64_t*>(partial + CONSUMER_WARPS * 4 * NT * 32);
  uint64_t* empty = full + stages;

  const int units = SWIGLU ? n / 8 : n / UNIT_ROWS;
  const int k_steps = (k + KC - 1) / KC;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], CONSUMER_WARPS * 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == CONSUMER_WARPS) {  // the producer: every weight row of every stage of this CTA's units, in order
    const uint64_t policy = evict_first_policy();
    int t = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      for (int ks = 0; ks < k_steps; ++ks, ++t) {
        const int slot = t % stages;
        mbar_wait(&empty[slot], ((t / stages) & 1) ^ 1);
        const int k0 = ks * KC;
        const uint32_t row_bytes = static_cast<uint32_t>(min(KC, k - k0)) * 2;
        if (lane == 0) mbar_arrive_expect_tx(&full[slot], row_bytes * UNIT_ROWS);
        __syncwarp();
        if (lane < UNIT_ROWS) {
          const int row = SWIGLU ? (lane < 8 ? u * 8 + lane : n + u * 8 + lane - 8) : u * UNIT_ROWS + lane;
          bulk_copy(ring + slot * STAGE_BYTES + lane * ROW_STRIDE, w + static_cast<size_t>(row) * k + k0, row_bytes,
                    &full[slot], policy);
        }
      }
    }
    if (trigger == 1) let_successor_launch();
    return;
  }

  // the consumers
  const int g = lane / 4, q = lane % 4;
  const int lane_col = warp * K_PER_WARP + q * 16;  // this lane's first column within a stage
  wait_for_predecessor();
  int t = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    uint4 xs[NT][2];
    load_x<NT>(xs, x, m, k, g, lane_col);
    for (int ks = 0; ks < k_steps; ++ks, ++t) {
      const int slot = t % stages;
      const int col = ks * KC + lane_col;
      uint4 xn[NT][2];
      load_x<NT>(xn, x, m, k, g, col + KC);  // the next stage's x, in flight while this one computes
      mbar_wait(&full[slot], (t / stages) & 1);
      const unsigned char* base = ring + slot * STAGE_BYTES + lane_col * 2;
      uint4 lo[2], hi[2];
      lo[0] = *reinterpret_cast<const uint4*>(base + g * ROW_STRIDE);
      lo[1] = *reinterpret_cast<const uint4*>(base + g * ROW_STRIDE + 16);
      hi[0] = *reinterpret_cast<const uint4*>(base + (g + 8) * ROW_STRIDE);
      hi[1] = *reinterpret_cast<const uint4*>(base + (g + 8) * ROW_STRIDE + 16);
      mbar_arrive(&empty[slot]);  // this thread's share of the stage is in registers: the producer may refill it
      if (col >= k) lo[0] = lo[1] = hi[0] = hi[1] = make_uint4(0, 0, 0, 0);  // past K: stale shared memory
      const uint32_t* a_lo = reinterpret_cast<const uint32_t*>(lo);
      const uint32_t* a_hi = reinterpret_cast<const uint32_t*>(hi);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t* b = reinterpret_cast<const uint32_t*>(xs[nt]);
#pragma unroll
        for (int j = 0; j < 4; ++j) mma(acc[nt], a_lo[2 * j], a_hi[2 * j], a_lo[2 * j + 1], a_hi[2 * j + 1],
                                        b[2 * j], b[2 * j + 1]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xs[nt][0] = xn[nt][0], xs[nt][1] = xn[nt][1];
    }
    const bool last_unit = u + static_cast<int>(gridDim.x) >= units;
    if (trigger == 2 && last_unit) let_successor_launch();

    // the four warps' partial sums of this unit meet in shared memory; warp 0 adds them and stores
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[((warp * NT + nt) * 4 + i) * 32 + lane] = acc[nt][i];
    consumers_sync();
    if (warp == 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float s[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[i] = 0.f;
#pragma unroll
          for (int v = 0; v < CONSUMER_WARPS; ++v) s[i] += partial[((v * NT + nt) * 4 + i) * 32 + lane];
        }
        const int r0 = 2 * q + 8 * nt;  // c0, c2: row r0; c1, c3: row r0 + 1
        if (SWIGLU) {                   // A rows 0-7 gate, 8-15 up: c0/c1 gate, c2/c3 up of column u * 8 + g
          const int c = u * 8 + g;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (r0 + h < m) {
              const float gate = round_bf16(s[h]), up = round_bf16(s[2 + h]);
              out[static_cast<size_t>(r0 + h) * n + c] = __float2bfloat16(gate / (1.f + __expf(-gate)) * up);
            }
          }
        } else {  // c0/c1: column u * 16 + g, c2/c3: column u * 16 + g + 8
          const int c = u * UNIT_ROWS + g;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (r0 + h < m) {
              out[static_cast<size_t>(r0 + h) * n + c] = __float2bfloat16(s[h]);
              out[static_cast<size_t>(r0 + h) * n + c + 8] = __float2bfloat16(s[2 + h]);
            }
          }
        }
      }
    }
    consumers_sync();  // the partials may be overwritten by the next unit
  }
}

}  // namespace

#define FEW_ROWS_TMA(NAME, NT, SWIGLU)                                                                             \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                         \
      NAME(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ out, \
           int m, int n, int k, int stages, int trigger) {                                                         \
    few_rows_tma<NT, SWIGLU>(x, w, out, m, n, k, stages, trigger);                                                 \
  }

FEW_ROWS_TMA(few_rows_tma_8, 1, false)
FEW_ROWS_TMA(few_rows_tma_16, 2, false)
FEW_ROWS_TMA(few_rows_tma_swiglu_8, 1, true)
FEW_ROWS_TMA(few_rows_tma_swiglu_16, 2, true)
