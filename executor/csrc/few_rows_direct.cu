// The few-row matmul with its weights loaded straight into the tensor cores' registers: out = x @ w.T for up to 16
// rows of x, optionally with the SwiGLU of a fused gate/up projection in the epilogue. Launched by
// executor/few_rows_direct.py.
//
// Why: at a few rows a projection is a stream of weights with next to no arithmetic, and every instruction between
// a weight's load and its MMA is overhead. The Triton few-row kernel and the tensor-copy kernel beside this file
// both stage weights in shared memory and read them back (Nsight Compute: the tensor-copy kernel ran 1.4-3.4x the
// Triton kernel's instructions and was bound by its consumers). Here each lane loads 16 bytes of a weight row into
// registers that are already an MMA operand: no shared memory, no barriers, no swizzle in the loop.
//
// Arithmetic: mma.sync m16n8k16 (bf16 in, fp32 accumulate) with the weights as A and the rows as B. The order of the
// 16 k slots of an MMA is free as long as A and B agree, so lane (g, q) loads columns 8q .. 8q + 7 of a 32-column
// step for weight rows g and g + 8 and row g of x, and feeds columns 8q + {0, 1, 2, 3} to one MMA's k slots
// {2q, 2q + 1, 2q + 8, 2q + 9} and 8q + {4 .. 7} to a second's. A warp holds four 16-row weight tiles at up to 8
// rows of x (64 output columns; with SwiGLU 32 gate and the same 32 up columns), two at 9-16, so every fragment of x
// feeds four (two) MMAs, within 128 registers a thread: two CTAs share an SM.
//
// Work: a CTA (8 warps) owns one block of weight rows and a contiguous share of K (a split); its warps take
// contiguous runs of 32-column steps of that share, two steps of loads in flight each, the first two issued before
// griddepcontrol.wait (weights never depend on the kernel before; x does). The warps' partial sums meet in shared
// memory; the splits of a block are one thread-block cluster, whose CTAs each add up a share of the block's outputs
// from all of the cluster's shared memories in a fixed order (deterministic, no global workspace, no atomics).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace cg = cooperative_groups;

namespace {

constexpr int WARPS = 8;
constexpr int THREADS = WARPS * 32;
constexpr int STEP = 32;  // K columns per warp step

// read once: kept out of L1 (an L2::256B prefetch hint here raised L2 traffic by a third and ran 10-20% slower)
__device__ __forceinline__ uint4 load_weights(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 load_rows(const uint4* p) {  // read by every block: cached
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ void wait_for_predecessor() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void let_successor_launch() { asm volatile("griddepcontrol.launch_dependents;" :::); }

__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

// One warp step's operands: weight rows g and g + 8 of each tile, and rows g (+ 8) of x, 8 columns each.
template <int TILES, int NT>
struct Step {
  uint4 w[TILES][2];
  uint4 x[NT];
};

// Where a lane reads: its weight rows (one pointer per tile and half, at column 8q) and its rows of x, and which of
// them exist (a tile past the weight's end or a row past x's loads zeros). Each load's address is computed from the
// step: measured faster than advancing the pointers (an Ouro-1.4B O projection at 4 rows 5.0 against 6.0 us).
template <int TILES, int NT>
struct Lane {
  const __nv_bfloat16* w[TILES][2];
  const __nv_bfloat16* x[NT];
  bool tile_ok[TILES];
  bool row_ok[NT];

  __device__ __forceinline__ void load_weights_of(Step<TILES, NT>& s, int step) const {
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        s.w[t][h] = tile_ok[t] ? load_weights(reinterpret_cast<const uint4*>(w[t][h] + step * STEP))
                               : make_uint4(0, 0, 0, 0);
  }

  __device__ __forceinline__ void load_rows_of(Step<TILES, NT>& s, int step) const {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      s.x[nt] = row_ok[nt] ? load_rows(reinterpret_cast<const uint4*>(x[nt] + step * STEP)) : make_uint4(0, 0, 0, 0);
  }
};

template <int TILES, int NT>
__device__ __forceinline__ void mma_step(float (&acc)[TILES][NT][4], const Step<TILES, NT>& s) {
#pragma unroll
  for (int t = 0; t < TILES; ++t)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma(acc[t][nt], s.w[t][0].x, s.w[t][1].x, s.w[t][0].y, s.w[t][1].y, s.x[nt].x, s.x[nt].y);
      mma(acc[t][nt], s.w[t][0].z, s.w[t][1].z, s.w[t][0].w, s.w[t][1].w, s.x[nt].z, s.x[nt].w);
    }
}

// The index of accumulator (t, nt, i) of `lane` among a warp's partial sums (lanes innermost: conflict-free).
template <int NT>
__device__ __forceinline__ int entry(int t, int nt, int i, int lane) {
  return ((t * NT + nt) * 4 + i) * 32 + lane;
}

// TILES: 16-row weight tiles per warp (with SwiGLU half of them gate rows, half the same up rows); NT: 8-row MMA
// tiles of x (1 or 2). The grid is blocks x splits CTAs, CTA b * splits + s taking split s of block b; with splits > 1
// it is launched as clusters of `splits` CTAs. trigger: 0 never lets the successor launch early, 1 right after
// griddepcontrol.wait, 2 once every warp is past its main loop.
template <int TILES, int NT, bool SWIGLU>
__device__ __forceinline__ void few_rows_direct(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x,
                                                __nv_bfloat16* __restrict__ out, int m, int n, int k, int splits,
                                                int trigger) {
  constexpr int ENTRIES = TILES * NT * 4 * 32;        // a warp's accumulators
  constexpr int OUTPUTS = SWIGLU ? ENTRIES / 2 : ENTRIES;  // the block's outputs (gate and up make one)
  constexpr int BLOCK_COLS = SWIGLU ? 16 * TILES / 2 : 16 * TILES;
  __shared__ float partial[WARPS][ENTRIES];
  __shared__ float total[ENTRIES];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int block = blockIdx.x / splits, split = blockIdx.x % splits;
  const int col0 = block * BLOCK_COLS;

  // this warp's steps: a contiguous run of its CTA's split of K
  const int steps = k / STEP;
  const int lo = steps * split / splits, hi = steps * (split + 1) / splits;
  const int first = lo + (hi - lo) * warp / WARPS, count = lo + (hi - lo) * (warp + 1) / WARPS - first;

  Lane<TILES, NT> at;
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    const int half_tile = SWIGLU ? t % (TILES / 2) : t;  // with SwiGLU tiles TILES / 2 .. are the up rows
    const int row = col0 + 16 * half_tile;
    at.tile_ok[t] = row < n;
    const int wrow = (SWIGLU && t >= TILES / 2 ? n : 0) + row + g;
#pragma unroll
    for (int h = 0; h < 2; ++h) at.w[t][h] = w + static_cast<size_t>(wrow + 8 * h) * k + 8 * q;
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    at.row_ok[nt] = g + 8 * nt < m;
    at.x[nt] = x + static_cast<size_t>(g + 8 * nt) * k + 8 * q;
  }

  float acc[TILES][NT][4];
#pragma unroll
  for (int t = 0; t < TILES; ++t)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[t][nt][0] = acc[t][nt][1] = acc[t][nt][2] = acc[t][nt][3] = 0.f;

  // two steps in flight: a and b hold steps s and s + 1 while s + 2 and s + 3 load
  Step<TILES, NT> a, b;
  if (count > 0) at.load_weights_of(a, first);
  if (count > 1) at.load_weights_of(b, first + 1);
  wait_for_predecessor();  // x is the kernel before's output
  if (trigger == 1) let_successor_launch();
  if (count > 0) at.load_rows_of(a, first);
  if (count > 1) at.load_rows_of(b, first + 1);
  for (int s = 0; s < count; s += 2) {
    mma_step(acc, a);
    if (s + 2 < count) {
      at.load_weights_of(a, first + s + 2);
      at.load_rows_of(a, first + s + 2);
    }
    if (s + 1 < count) {
      mma_step(acc, b);
      if (s + 3 < count) {
        at.load_weights_of(b, first + s + 3);
        at.load_rows_of(b, first + s + 3);
      }
    }
  }
  if (trigger == 2) let_successor_launch();

  // the warps' partial sums, then the CTA's
#pragma unroll
  for (int t = 0; t < TILES; ++t)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][entry<NT>(t, nt, i, lane)] = acc[t][nt][i];
  __syncthreads();
  for (int e = threadIdx.x; e < ENTRIES; e += THREADS) {
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < WARPS; ++v) sum += partial[v][e];
    total[e] = sum;
  }

  // the cluster's CTAs add up the splits, each a share of the block's outputs, in rank order
  cg::cluster_group cluster = cg::this_cluster();
  if (splits > 1) {
    cluster.sync();
  } else {
    __syncthreads();
  }
  const int share_lo = OUTPUTS * split / splits, share_hi = OUTPUTS * (split + 1) / splits;
  for (int o = share_lo + threadIdx.x; o < share_hi; o += THREADS) {
    float gate = 0.f, up = 0.f;
    for (int r = 0; r < splits; ++r) {
      const float* sums = splits > 1 ? cluster.map_shared_rank(total, r) : total;
      gate += sums[o];
      if (SWIGLU) up += sums[o + OUTPUTS];
    }
    const int e_lane = o % 32, i = (o / 32) % 4, tile = o / 128;
    const int t = tile / NT, nt = tile % NT;
    const int col = col0 + 16 * t + e_lane / 4 + 8 * (i / 2), row = 8 * nt + 2 * (e_lane % 4) + i % 2;
    if (row >= m || col >= n) continue;
    float value = gate;
    if (SWIGLU) {
      const float gate_r = round_bf16(gate);
      value = gate_r / (1.f + __expf(-gate_r)) * round_bf16(up);
    }
    out[static_cast<size_t>(row) * n + col] = __float2bfloat16(value);
  }
  if (splits > 1) cluster.sync();  // the other CTAs may still be reading this one's sums
}

}  // namespace

// Two CTAs per SM, so one streams while the other starts or finishes (at most 128 registers a thread)
#define FEW_ROWS_DIRECT(NAME, TILES, NT, SWIGLU)                                                                \
  extern "C" __global__ void __launch_bounds__(THREADS, 2)                                                      \
      NAME(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x,                            \
           __nv_bfloat16* __restrict__ out, int m, int n, int k, int splits, int trigger) {                     \
    few_rows_direct<TILES, NT, SWIGLU>(w, x, out, m, n, k, splits, trigger);                                    \
  }

FEW_ROWS_DIRECT(few_rows_direct_8, 4, 1, false)
FEW_ROWS_DIRECT(few_rows_direct_16, 2, 2, false)
FEW_ROWS_DIRECT(few_rows_direct_swiglu_8, 4, 1, true)
FEW_ROWS_DIRECT(few_rows_direct_swiglu_16, 2, 2, true)
