// The fused evaluator's tile loop (fused_kernel.hpp): a prepared program run over L1 tiles of its
// output on one thread, each instruction's kernel over a whole tile, the next tile's buffers
// prefetched meanwhile; and the reductions built on it, over rows (run_reduction) and over the
// leading axes (run_columns), adding in the eager reduction's order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "../backend/cpu/parallel.hpp"
#include "../backend/cpu/reduce.hpp"
#include "../backend/cpu/reduce_stream.hpp"
#include "fused_prepare.hpp"

namespace stagecraft::graph {

namespace detail_fused {

/// Per-thread scratch, kept between runs: grows, never shrinks, so steady runs allocate nothing.
struct Scratch {
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { ::operator delete(data, std::align_val_t{64}); }
  std::byte* get(std::size_t want) {
    if (want > bytes) {
      ::operator delete(data, std::align_val_t{64});
      data = nullptr, bytes = 0;
      data = static_cast<std::byte*>(::operator new(want, std::align_val_t{64}));
      std::memset(data, 0, want);  // padding lanes start as zeros, not indeterminate bytes
      bytes = want;
    }
    return data;
  }
};
STAGECRAFT_COMPILED_INLINE Scratch& thread_scratch();

/// Bytes between scratch slots: a tile plus a cache line, so slots are not a multiple of 4 KiB
/// apart (loads from one slot and stores to the next would falsely alias in the L1).
STAGECRAFT_COMPILED_INLINE std::int64_t slot_stride(const PreparedFused& pf);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

STAGECRAFT_COMPILED_INLINE std::int64_t slot_stride(const PreparedFused& pf) {
  return (pf.tile * static_cast<std::int64_t>(itemsize(pf.program.dtype)) + 63) / 64 * 64 + 64;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// A run's register locations, gathers and single values (the calling thread's, reused).
struct RunState {
  std::vector<Loc> locs;
  std::vector<Gather> gathers;
  std::vector<std::byte> values;
  std::vector<std::pair<const std::byte*, bool>> streams;  ///< buffers walked tile by tile (true: written)
  std::vector<std::byte> partials;  ///< a reduction's partial results, one per chunk
  bool rows = false;                ///< some gather has Gather::rows
};
STAGECRAFT_COMPILED_INLINE RunState& run_state();
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE RunState& run_state() {
  thread_local RunState s;
  return s;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Asks for lines [from, to) of the next tile of every buffer (at byte offset off) while this
/// tile computes, a few lines before each step: a tile reads each buffer in one short burst,
/// which the hardware prefetchers, stopping at every 4 KiB page, do not hide (bench_fusion, 9-op
/// chain over 5 buffers of 16M floats, 1 thread: 43 ms without, 30 ms with). Always inlined: as a
/// function of its own, GCC 12 finds it free of side effects and deletes every call to it.
SC_ALWAYS_INLINE void prefetch(const RunState& st, std::int64_t off, std::int64_t from, std::int64_t to) {
  for (const auto& [base, write] : st.streams) {
    const std::byte* p = base + off;
    if (write)
      for (std::int64_t l = from; l < to; ++l) __builtin_prefetch(p + l * 64, 1, 3);
    else
      for (std::int64_t l = from; l < to; ++l) __builtin_prefetch(p + l * 64, 0, 3);
  }
}

/// Where a register is during a tile: at(r, t0) points at register r's elements of the tile
/// starting at t0 (what run() hands the function it calls after each tile).
template <class T>
struct RegAt {
  const Loc* locs;
  std::byte* ws;
  T* operator()(int r, std::int64_t t0) const {
    const Loc& l = locs[r];
    return reinterpret_cast<T*>((l.ptr ? l.ptr : ws) + l.off + t0 * l.stride);
  }
};

/// A reference to what run() calls after each tile, f(at, t0, len) (a reduction reads its
/// register there), or nothing: one instantiation of the tile loop per dtype serves every
/// caller, at one indirect call per tile. The callable must outlive the run.
template <class T>
class AfterTile {
 public:
  AfterTile() = default;
  template <class F>
    requires std::invocable<const F&, const RegAt<T>&, std::int64_t, std::int64_t>
  AfterTile(const F& f)  // NOLINT: made from the caller's lambda
      : f_(&f), call_([](const void* p, const RegAt<T>& at, std::int64_t t0, std::int64_t len) {
          (*static_cast<const F*>(p))(at, t0, len);
        }) {}
  explicit operator bool() const { return call_ != nullptr; }
  void operator()(const RegAt<T>& at, std::int64_t t0, std::int64_t len) const { call_(f_, at, t0, len); }

 private:
  const void* f_ = nullptr;
  void (*call_)(const void*, const RegAt<T>&, std::int64_t, std::int64_t) = nullptr;
};

/// Runs tiles of a prepared program on this thread: set up once per task (the thread's scratch,
/// its copy of the register locations when some input is read in place by rows), then run(b, e,
/// after_tile) per range of output elements, as often as the task needs (a row at a time).
template <class T>
class TileRun {
 public:
  TileRun(const PreparedFused& pf, const RunState& st)
      : pf_(pf),
        st_(st),
        stride_(slot_stride(pf)),
        nsteps_(static_cast<std::int64_t>(pf.per_tile.size()) + 1),
        prefetching_(pf.per_tile.size() > 1) {
    // (one slot more with windowed outputs: a single value spread over a tile before its copy)
    const int slots = std::max(pf.num_slots + (pf.out_plans.empty() ? 0 : 1), 1);
    ws_ = thread_scratch().get(static_cast<std::size_t>(slots * stride_));
    locs_ = st.locs.data();
    if (st.rows) {  // (pointed at each such input's row per tile)
      own_.assign(st.locs.begin(), st.locs.end());
      locs_ = own_.data();
    }
  }

  /// Runs the tiles of output elements [b, e); after each, after_tile(register locations, t0,
  /// len) (a reduction reads its register there). The next tile's buffers are prefetched up to
  /// element `ahead` (e when -1; further when the caller runs the next range after this one).
  void run(std::int64_t b, std::int64_t e, AfterTile<T> after_tile = {}, std::int64_t ahead = -1);

 private:
  const PreparedFused& pf_;
  const RunState& st_;
  std::int64_t stride_, nsteps_;
  /// Whether the next tile is prefetched: not when a tile makes one pass (one step, or one chain),
  /// which streams its buffers as a plain loop does and the hardware prefetchers follow it (a
  /// chain of 8 ops over 16M floats, 1 thread: 13.5-14.3 ms prefetched, 8.6-9.1 ms not).
  bool prefetching_;
  std::byte* ws_ = nullptr;
  std::vector<Loc> own_;
  const Loc* locs_ = nullptr;
};

template <class T>
void TileRun<T>::run(std::int64_t b, std::int64_t e, AfterTile<T> after_tile, std::int64_t ahead) {
  const PreparedFused& pf = pf_;
  const std::int64_t tile = pf.tile;
  std::byte* const ws = ws_;
  const Loc* const locs = locs_;
  const RegAt<T> at{locs, ws};
  const T* one[max_splats] = {};  // with per_tile_splat: the value each such input holds in this tile
  for (std::int64_t t0 = b; t0 < e; t0 += tile) {
    const std::int64_t len = std::min(tile, e - t0);
    // lines of each buffer in the next tile, and where that tile starts
    const std::int64_t pe = ahead < 0 ? e : ahead;
    const std::int64_t lines =
        prefetching_ && t0 + tile < pe ? (std::min(tile, pe - t0 - tile) * std::int64_t{sizeof(T)} + 63) / 64 : 0;
    const std::int64_t off = (t0 + tile) * std::int64_t{sizeof(T)};
    std::int64_t k = 0;
    // (each step's share of the lines: two divisions a step, skipped where nothing is prefetched)
    if (lines > 0) prefetch(st_, off, 0, lines / nsteps_);
    bool splat = !pf.per_tile_splat.empty();
    for (const Gather& g : st_.gathers)
      if (splat && g.splat >= 0)
        splat = (one[g.splat] = constant_run<T>(reinterpret_cast<const T*>(g.src), *g.plan, t0, len)) != nullptr;
    for (const Gather& g : st_.gathers) {
      if (splat && g.splat >= 0) continue;
      T* dst = reinterpret_cast<T*>(ws + g.off);
      const T* src = reinterpret_cast<const T*>(g.src);
      if (g.rows) {  // (in place when the tile lies in one row, else gathered into its slot)
        const T* row = contiguous_run<T>(src, *g.plan, t0, len);
        own_[static_cast<std::size_t>(g.reg)] = {reinterpret_cast<std::byte*>(const_cast<T*>(row)), row ? 0 : g.off, 0};
        if (row) continue;
      }
      if (g.plan) copy_walk<false, T>(src, *g.plan, t0, len, dst);
      else std::memcpy(dst, src + t0, static_cast<std::size_t>(len) * sizeof(T));
    }
    for (const Step& s : splat ? pf.per_tile_splat : pf.per_tile) {
      ++k;
      if (lines > 0) prefetch(st_, off, lines * k / nsteps_, lines * (k + 1) / nsteps_);
      if (s.chain >= 0) {  // (its operands where the tile has them, then one pass over the tile)
        const Chain& c = pf.chains[static_cast<std::size_t>(s.chain)];
        const int nl = static_cast<int>(c.links.size());
        const T* others[max_links];
        for (int l = 0; l < nl; ++l) {
          const int o = c.links[static_cast<std::size_t>(l)].other;
          others[l] = o >= 0 ? at(o, t0) : (o == -1 ? nullptr : one[-2 - o]);
        }
        run_chain<T>(c.links.data(), nl, others, c.head >= 0 ? at(c.head, t0) : one[-2 - c.head], at(s.y, t0), len);
        continue;
      }
      const T* a = s.a >= 0 ? at(s.a, t0) : one[-2 - s.a];
      const T* bv = s.b >= 0 ? at(s.b, t0) : (s.b == -1 ? nullptr : one[-2 - s.b]);
      reinterpret_cast<Kernel<T>>(s.fn)(a, bv, at(s.y, t0), len);
    }
    for (const CopyOut& c : pf.copies) {
      const T* src = at(c.reg, t0);
      T* base = reinterpret_cast<T*>(locs[pf.regs.size() + c.output].ptr);
      if (!pf.out_plans.empty() && pf.program.out_windowed(static_cast<std::size_t>(c.output))) {
        if (pf.regs[c.reg].scalar_value()) {  // (one value: a tile of it first)
          T* tmp = reinterpret_cast<T*>(ws + pf.num_slots * stride_);
          std::fill_n(tmp, len, *src);
          src = tmp;
        }
        copy_walk<true, T>(base, pf.out_plans[static_cast<std::size_t>(c.output)], t0, len, src);
      } else if (pf.regs[c.reg].scalar_value()) {
        std::fill_n(base + t0, len, *src);
      } else {
        std::memcpy(base + t0, src, static_cast<std::size_t>(len) * sizeof(T));
      }
    }
    if (after_tile) after_tile(at, t0, len);
  }
}

/// Runs the tiles of output elements [b, e) on this thread (TileRun::run, set up for one range).
template <class T>
void run_tiles(const PreparedFused& pf, const RunState& st, std::int64_t b, std::int64_t e, AfterTile<T> after_tile = {}) {
  TileRun<T>(pf, st).run(b, e, after_tile);
}

/// Register `reg` over the whole program in flat tiles (as the eager op's flat loop batches its
/// elements), into a buffer: the reductions' path for programs whose SIMD bits depend on the batch.
template <class T>
std::vector<T> flat_values(const PreparedFused& pf, const RunState& st, int reg) {
  std::vector<T> flat(static_cast<std::size_t>(pf.numel));
  backend::cpu::parallel_for(pf.numel, pf.grain, [&](std::int64_t b, std::int64_t e) {
    run_tiles<T>(pf, st, b, e, [&](const auto& at, std::int64_t t0, std::int64_t len) {
      std::copy_n(at(reg, t0), len, flat.data() + t0);
    });
  });
  return flat;
}

/// Elements [b, b + len) of the program's reduced value, one row (or one chunk of a row) of the
/// eager kernel, reduced as reduce_row reduces len elements: one tile at once, longer spans fed
/// tile by tile to its pairwise pieces (reduce_streamed, the next piece's first tile prefetched).
template <class Rd, class T>
T reduce_span(const PreparedFused& pf, TileRun<T>& tiles, std::int64_t b, std::int64_t len) {
  const int reg = pf.program.reduction->reg;
  if (len <= pf.tile) {
    T r{};
    tiles.run(b, b + len, [&](const auto& at, std::int64_t t0, std::int64_t k) {
      r = backend::cpu::reduce_row<Rd, T, T>(at(reg, t0), k);
    });
    return r;
  }
  return backend::cpu::reduce_streamed<Rd, T>(len, [&](std::int64_t e0, std::int64_t e1, auto& leaf) {
    const auto take = [&](const auto& at, std::int64_t t0, std::int64_t k) { leaf.add(at(reg, t0), k); };
    tiles.run(b + e0, b + e1, take, b + len);
  });
}

/// A reduction over the program's last axes (rows of rd.inner elements): the eager kernel's order
/// (reduce3 over [rows, inner, 1]) so the results are its bits. Few long rows are cut into the
/// same chunks (chunk_rows), a task each; a task evaluates its elements tile by tile and reduces
/// them as reduce_row does (the pairwise pieces of a float sum, in each the SIMD accumulators:
/// reduce_streamed), and the chunks' results are reduced by the kernel's second step.
template <class Rd, class T>
void run_reduction(const PreparedFused& pf, RunState& st, T* out) {
  namespace cpu = backend::cpu;
  const FusedReduction& rd = *pf.program.reduction;
  const std::int64_t n = rd.inner, rows = pf.numel / n;
  if (pf.batch_dependent && n % static_cast<std::int64_t>(batch<T>::size) != 0) {
    // Rows that do not start on a batch boundary would batch other elements together than the
    // eager op's flat loop, which changes the bits of sin and cos: the program runs over the whole
    // output in flat tiles (into a buffer), then the eager reduction.
    const std::vector<T> flat = flat_values<T>(pf, st, rd.reg);
    cpu::reduce3<Rd, T, T>(flat.data(), out, rows, n, 1);
    return;
  }
  const std::int64_t per = cpu::chunk_rows(rows, n, 1), chunks = (n + per - 1) / per, tasks = rows * chunks;
  // (out is written last: the plan may give it the buffer of an input that the tiles read)
  st.partials.resize(static_cast<std::size_t>(tasks) * sizeof(T));
  T* part = reinterpret_cast<T*>(st.partials.data());
  cpu::parallel_rows(tasks, std::min(per, n), pf.grain, [&](std::int64_t tb, std::int64_t te) {
    TileRun<T> tiles(pf, st);
    for (std::int64_t t = tb; t < te; ++t) {
      const std::int64_t row = t / chunks, c = t % chunks;
      part[t] = reduce_span<Rd, T>(pf, tiles, row * n + c * per, std::min(per, n - c * per));
    }
  });
  if (chunks > 1) cpu::reduce3<Rd, T, T>(part, out, rows, chunks, 1, false);
  else std::copy_n(part, rows, out);
}

/// Columns one task of a column reduction covers at most (a multiple of every batch size; from the
/// shape only, as the row chunks, so results do not depend on the thread count).
inline constexpr std::int64_t column_group = 2048;

/// A reduction over the program's leading axes (FusedReduction::leading): out[c] = reduction over
/// the rows r of reg[r * C + c]. Tasks take a chunk of rows and a group of columns, evaluate the
/// program over those elements (whole rows at once when a group is every column) and accumulate
/// each tile into the chunk's row of partial results as the backend's column reduction does (the
/// same chunks, a sum's rows pairwise in blocks of col_block, the first row copied), and the
/// chunks' partial rows are reduced by that kernel: every column adds in the eager sum's order,
/// so the results are its bits. Every element of the program is evaluated once, so its
/// elementwise outputs are written as by run_tiles over the whole range.
template <class Rd, class T>
void run_columns(const PreparedFused& pf, RunState& st, T* out) {
  namespace cpu = backend::cpu;
  const FusedReduction& rd = *pf.program.reduction;
  const std::int64_t C = rd.inner, R = pf.numel / C;
  const std::int64_t cw = std::min(C, column_group), groups = (C + cw - 1) / cw;
  if (pf.batch_dependent && C % static_cast<std::int64_t>(batch<T>::size) != 0) {
    // Rows that do not start on a batch boundary would batch other elements together than the
    // eager op's flat loop (sin and cos): flat tiles into a buffer, then the column reduction.
    const std::vector<T> flat = flat_values<T>(pf, st, rd.reg);
    cpu::reduce3<Rd, T, T>(flat.data(), out, 1, R, C);
    return;
  }
  // The chunks of rows the backend's column reduction (reduce3) cuts [R, C] into, so that every
  // column adds in its order: the eager sum's bits.
  const std::int64_t per = cpu::chunk_rows(1, R, C), chunks = (R + per - 1) / per;
  // (out is written last: the plan may give it the buffer of an input that the tiles read)
  st.partials.resize(static_cast<std::size_t>(chunks * C) * sizeof(T));
  T* part = reinterpret_cast<T*>(st.partials.data());
  int levels = 1;  // scratch rows the pairwise split needs (one per level; a few spare)
  for (std::int64_t n = per; n > 0; n /= 2) ++levels;
  cpu::parallel_rows(chunks * groups, per * cw, pf.grain, [&](std::int64_t tb, std::int64_t te) {
    thread_local std::vector<T> scratch;
    if (scratch.size() < static_cast<std::size_t>(levels * cw)) scratch.resize(static_cast<std::size_t>(levels * cw));
    TileRun<T> tiles(pf, st);
    for (std::int64_t t = tb; t < te; ++t) {
      const std::int64_t c = t / groups, c0 = (t % groups) * cw, len = std::min(cw, C - c0);
      // acc[0, len) = the reduction of rows [r0, r1) (r1 - r0 <= col_block, or any for max, min)
      const auto leaf = [&](std::int64_t r0, std::int64_t r1, T* acc) {
        const auto take = [&](std::int64_t row, std::int64_t col, const T* v, std::int64_t n) {
          if (row == r0) std::copy_n(v, n, acc + col);
          else cpu::accumulate_row<Rd, T, T>(acc + col, v, n);
        };
        if (len == C) {  // whole rows: one pass over them
          tiles.run(r0 * C, r1 * C, [&](const auto& at, std::int64_t t0, std::int64_t n) {
            const T* v = at(rd.reg, t0);
            for (std::int64_t i = t0, e = t0 + n; i < e;) {
              const std::int64_t row = i / C, col = i - row * C, k = std::min(e - i, C - col);
              take(row, col, v + (i - t0), k);
              i += k;
            }
          });
          return;
        }
        for (std::int64_t row = r0; row < r1; ++row) {
          const std::int64_t b = row * C + c0;
          tiles.run(b, b + len, [&](const auto& at, std::int64_t t0, std::int64_t n) {
            take(row, t0 - b, at(rd.reg, t0), n);
          });
        }
      };
      const auto rows = [&](const auto& self, std::int64_t r0, std::int64_t r1, T* acc, int level) -> void {
        if constexpr (Rd::is_sum) {
          if (r1 - r0 > cpu::col_block) {
            const std::int64_t h = (r1 - r0) / 2;
            self(self, r0, r0 + h, acc, level + 1);
            T* tmp = scratch.data() + level * cw;
            self(self, r0 + h, r1, tmp, level + 1);
            cpu::accumulate_row<Rd, T, T>(acc, tmp, len);
            return;
          }
        }
        leaf(r0, r1, acc);
      };
      rows(rows, c * per, std::min(R, (c + 1) * per), part + c * C + c0, 0);
    }
  });
  if (chunks > 1) cpu::reduce3<Rd, T, T>(part, out, 1, chunks, C, false);
  else std::copy_n(part, C, out);
}

}  // namespace detail_fused

}  // namespace stagecraft::graph
