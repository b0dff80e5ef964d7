// The few-row matmul with its weights and rows streamed by the tensor copy engine (TMA): out = x @ w.T for up to 16
// rows of x, optionally with the SwiGLU of a fused gate/up projection in the epilogue. Launched by
// executor/few_rows_tma.py, which builds the two tensor maps.
//
// Why: a Triton kernel restarts its software pipeline in every program and keeps a few KB of weights in flight per
// SM, so a small projection spends much of its time filling and draining (Ouro-1.4B's O projection, 8 MB, took
// 5.4 us against 2 us of reads). Here each CTA owns a run of 16-column weight units and one producer warp streams all
// of them through a ring of shared-memory stages, one tensor copy of 16 weight rows x 256-1,024 columns (8-32 KB) and
// one of the rows' same columns per stage, completing on an mbarrier, so the stream never restarts between units. The
// weight copies of the first `stages` stages start before griddepcontrol.wait: under programmatic dependent launch
// the weights, which never depend on the kernel before, stream in under that kernel's tail; the rows are copied once
// it has finished.
//
// Layout: both tensors are mapped as [rows][K / 64][64] (the 64 columns of a 128-byte segment innermost) with the
// 128-byte swizzle, so a stage holds, per row, four 128-byte segments whose 16-byte units are permuted by the
// segment's index (physical unit = unit ^ (segment & 7)); the reads below are free of bank conflicts with it.
//
// Arithmetic: mma.sync m16n8k16 (bf16 in, fp32 accumulate) with the weights as A (16 output columns; with SwiGLU a
// second A tile of the same 16 up columns) and the rows as B (8 rows; two MMAs for 9-16 rows). Each consumer warp
// takes whole segments; lane group q reads units q and q + 4 of one (16 columns) for its rows, and its MMA k slots are
// mapped onto those columns the same way for A and B. The warps' partial sums meet in shared memory once per unit.
#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

constexpr int SEGMENT_BYTES = 128;  // 64 columns: the swizzle's row
constexpr int UNIT_ROWS = 16;       // output columns per weight unit: one MMA's M
constexpr int MAX_CONSUMER_WARPS = 8;
constexpr int MAX_THREADS = (MAX_CONSUMER_WARPS + 1) * 32;
constexpr int OPTION_WARP_ARRIVE = 1;  // a stage is released by one arrival per warp, not per thread

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

// one box of a 3-d tensor map ({column in segment, segment, row}) into shared memory, completing on `bar`
__device__ __forceinline__ void tensor_copy(void* dst, const CUtensorMap* map, int segment, int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(0), "r"(segment), "r"(row), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ void wait_for_predecessor() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void let_successor_launch() { asm volatile("griddepcontrol.launch_dependents;" :::); }

__device__ __forceinline__ void consumers_sync(int threads) { asm volatile("bar.sync 1, %0;" ::"r"(threads)); }

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t* a_lo, const uint32_t* a_hi, const uint32_t* b,
                                    int j) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a_lo[2 * j]), "r"(a_hi[2 * j]), "r"(a_lo[2 * j + 1]), "r"(a_hi[2 * j + 1]), "r"(b[2 * j]),
        "r"(b[2 * j + 1]));
}

// a lane's 16 columns of row `row` of a swizzled box of rows x segs x 64: units q and q + 4 of segment `seg`
__device__ __forceinline__ void load_row(uint4 (&dst)[2], const unsigned char* box, int row, int seg, int segs, int q) {
  const int segment = row * segs + seg;
  const unsigned char* base = box + segment * SEGMENT_BYTES;
  dst[0] = *reinterpret_cast<const uint4*>(base + ((q ^ (segment & 7)) << 4));
  dst[1] = *reinterpret_cast<const uint4*>(base + (((q + 4) ^ (segment & 7)) << 4));
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

// where warp `warp`'s partial sum i of MMA tile (tile, nt) sits for lane `lane` (the layout both sides of the
// reduction use: a lane's values 32 floats apart, so a warp's 32 lanes write and read without bank conflicts)
template <int NT, int TILES>
__device__ __forceinline__ int partial_index(int warp, int tile, int nt, int i, int lane) {
  return (((warp * TILES + tile) * NT + nt) * 4 + i) * 32 + lane;
}

// The sum of the consumer warps' partials of unit u (in `partial`), stored: lane (g, q) holds columns g and g + 8 of
// rows 2q, 2q + 1 (+ 8 for the second row tile); with SwiGLU tile 0 is the gate, tile 1 the up projection.
template <int NT, bool SWIGLU>
__device__ __forceinline__ void reduce_store(const float* partial, int warps, __nv_bfloat16* __restrict__ out, int m,
                                             int n, int u, int lane) {
  constexpr int TILES = SWIGLU ? 2 : 1;
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float s[TILES][4];
#pragma unroll
    for (int tile = 0; tile < TILES; ++tile)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[tile][i] = 0.f;
        for (int v = 0; v < warps; ++v) s[tile][i] += partial[partial_index<NT, TILES>(v, tile, nt, i, lane)];
      }
    const int r0 = 2 * q + 8 * nt, c = u * UNIT_ROWS + g;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (r0 + h >= m) continue;
      __nv_bfloat16* row = out + static_cast<size_t>(r0 + h) * n + c;
      if (SWIGLU) {
        const float gate0 = round_bf16(s[0][h]), gate8 = round_bf16(s[0][2 + h]);
        row[0] = __float2bfloat16(gate0 / (1.f + __expf(-gate0)) * round_bf16(s[TILES - 1][h]));
        row[8] = __float2bfloat16(gate8 / (1.f + __expf(-gate8)) * round_bf16(s[TILES - 1][2 + h]));
      } else {
        row[0] = __float2bfloat16(s[0][h]);
        row[8] = __float2bfloat16(s[0][2 + h]);
      }
    }
  }
}

// NT: 8-row MMA tiles of x (1 or 2); SWIGLU: the unit's 16 gate columns and the same 16 up columns (two weight boxes).
// trigger: 0 never lets the successor launch early, 1 once the producer has issued its last copy, 2 once the
// consumers are past their last stage (before the last unit's reduction and stores). A stage is `segs` segments (64
// columns each, 4-16); the block is one producer warp (the last) and blockDim.x / 32 - 1 consumer warps (4 or 8), which
// take the (stage, segment) pairs in turn: warp w the pairs p = w mod warps, p = stage * segs + segment.
template <int NT, bool SWIGLU>
__device__ __forceinline__ void few_rows_tma(const CUtensorMap* wmap, const CUtensorMap* xmap,
                                             __nv_bfloat16* __restrict__ out, int m, int n, int k, int stages,
                                             int segs, int trigger, int options) {
  constexpr int TILES = SWIGLU ? 2 : 1;
  const int kc = segs * 64, w_tile = UNIT_ROWS * kc * 2;
  const int stage_bytes = TILES * w_tile + 8 * NT * kc * 2;  // a multiple of 1024, as the swizzle needs
  extern __shared__ unsigned char smem_raw[];
  unsigned char* ring =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int consumer_warps = blockDim.x / 32 - 1;
  const int warps_per_stage = min(consumer_warps, segs);
  const bool warp_arrive = options & OPTION_WARP_ARRIVE;
  float* partial = reinterpret_cast<float*>(ring + stages * stage_bytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(partial + consumer_warps * TILES * 4 * NT * 32);
  uint64_t* empty = full + stages;

  const int units = n / UNIT_ROWS;
  const int k_steps = (k + kc - 1) / kc;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], warp_arrive ? warps_per_stage : warps_per_stage * 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == consumer_warps) {  // the producer: one lane issues every copy of this CTA's units, in order
    if (lane == 0) {
      const int total = ((units - blockIdx.x + gridDim.x - 1) / gridDim.x) * k_steps;
      const int ahead = min(stages, total);
      // the first `ahead` stages' weights before the wait (they never depend on the kernel before), their rows after
      for (int t = 0; t < total; ++t) {
        const int slot = t % stages;
        const int u = blockIdx.x + (t / k_steps) * gridDim.x, ks = t % k_steps;
        if (t >= ahead) mbar_wait(&empty[slot], ((t / stages) & 1) ^ 1);
        unsigned char* stage = ring + slot * stage_bytes;
        mbar_arrive_expect_tx(&full[slot], stage_bytes);
#pragma unroll
        for (int tile = 0; tile < TILES; ++tile)
          tensor_copy(stage + tile * w_tile, wmap, ks * segs, tile * n + u * UNIT_ROWS, &full[slot]);
        if (t + 1 == ahead) wait_for_predecessor();
        if (t + 1 >= ahead) {
          for (int r = t + 1 == ahead ? 0 : t; r <= t; ++r)  // at the wait: every stage so far; then this one
            tensor_copy(ring + (r % stages) * stage_bytes + TILES * w_tile, xmap, (r % k_steps) * segs, 0,
                        &full[r % stages]);
        }
      }
      if (trigger == 1) let_successor_launch();
    }
    return;
  }

  // the consumers
  const int g = lane / 4, q = lane % 4;
  const int per_stage = max(1, segs / consumer_warps);  // segments of a stage this warp takes
  const int stage_step = max(1, consumer_warps / segs);  // and stages from one of its stages to the next
  const int first_stage = warp / segs, first_segment = warp % segs;
  wait_for_predecessor();  // before any store: the kernel before may still read memory this one's output reuses
  int t0 = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x, t0 += k_steps) {
    float acc[TILES][NT][4];
#pragma unroll
    for (int tile = 0; tile < TILES; ++tile)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[tile][nt][0] = acc[tile][nt][1] = acc[tile][nt][2] = acc[tile][nt][3] = 0.f;
    for (int ks = first_stage; ks < k_steps; ks += stage_step) {
      const int t = t0 + ks, slot = t % stages;
      const unsigned char* stage = ring + slot * stage_bytes;
      mbar_wait(&full[slot], (t / stages) & 1);
      for (int i = 0; i < per_stage; ++i) {
        const int segment = first_segment + i * consumer_warps;
        uint4 a[TILES][2][2], b[NT][2];
#pragma unroll
        for (int tile = 0; tile < TILES; ++tile) {
          load_row(a[tile][0], stage + tile * w_tile, g, segment, segs, q);
          load_row(a[tile][1], stage + tile * w_tile, g + 8, segment, segs, q);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) load_row(b[nt], stage + TILES * w_tile, g + 8 * nt, segment, segs, q);
        if (i + 1 == per_stage) {  // this thread's share of the stage is in registers: the producer may refill it
          if (!warp_arrive) {
            mbar_arrive(&empty[slot]);
          } else {
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[slot]);
          }
        }
#pragma unroll
        for (int tile = 0; tile < TILES; ++tile)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j)
              mma(acc[tile][nt], reinterpret_cast<const uint32_t*>(a[tile][0]),
                  reinterpret_cast<const uint32_t*>(a[tile][1]), reinterpret_cast<const uint32_t*>(b[nt]), j);
      }
    }
    const bool last_unit = u + static_cast<int>(gridDim.x) >= units;
    if (trigger == 2 && last_unit) let_successor_launch();

    // the consumer warps' partial sums of this unit meet in shared memory; warp 0 adds them and stores
#pragma unroll
    for (int tile = 0; tile < TILES; ++tile)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          partial[partial_index<NT, TILES>(warp, tile, nt, i, lane)] = acc[tile][nt][i];
    consumers_sync(consumer_warps * 32);
    if (warp == 0) reduce_store<NT, SWIGLU>(partial, consumer_warps, out, m, n, u, lane);
    consumers_sync(consumer_warps * 32);  // the partials may be overwritten by the next unit
  }
}

}  // namespace

#define FEW_ROWS_TMA(NAME, NT, SWIGLU)                                                                           \
  extern "C" __global__ void __launch_bounds__(MAX_THREADS, 1)                                                   \
      NAME(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,                   \
           __nv_bfloat16* __restrict__ out, int m, int n, int k, int stages, int segs, int trigger, int options) {\
    few_rows_tma<NT, SWIGLU>(&wmap, &xmap, out, m, n, k, stages, segs, trigger, options);                        \
  }

FEW_ROWS_TMA(few_rows_tma_8, 1, false)
FEW_ROWS_TMA(few_rows_tma_16, 2, false)
FEW_ROWS_TMA(few_rows_tma_swiglu_8, 1, true)
FEW_ROWS_TMA(few_rows_tma_swiglu_16, 2, true)
