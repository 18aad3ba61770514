// The CPU backend's varlen attention: the tiled FlashAttention-2 algorithm on a few threads.
//
// Forward: one work item per (sequence, head, query tile of kBr rows); it walks the key tiles of
// kBc keys its rows can see, keeps a running max and sum per row (common/attention_tile.h), and
// writes its rows of out and lse. Backward, in two passes so no two items write the same output
// (deterministic, no atomics, independent of the thread count):
//   pass 1, per (sequence, head, query tile): D = rowsum(dout * out), then dq over the key tiles;
//   pass 2, per (sequence, kv head, key tile): dk and dv over the group's heads and the query
//           tiles, in a fixed order.
// Both recompute P = exp(s - lse). With a query-row map (attention.h) the query tiles cover only
// the mapped rows' runs (the other rows' tiles are blank: written as queries that see no key), and
// pass 2 walks only the mapped runs' query tiles; a mapped row sees the same key tiles' scores in
// the same order as without the map, so its results are bitwise the same. Tiles are converted to
// the accumulation type on load; the inner loops run over contiguous memory (key tiles are stored
// transposed for S = Q·Kᵀ) so the compiler vectorises them without reassociating sums.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/attention_tile.h"
#include "kernels/common/half.h"
#include "kernels/internal/backend.h"

namespace packsched::kernels::internal::cpu {
namespace {

constexpr int64_t kBr = 64;  // query rows per tile
constexpr int64_t kBc = 64;  // keys per tile

// A run of query rows [first, first + n) of a sequence's segment: computed (`mapped`), or blank
// (outside the query-row map: written as queries that see no key).
struct Run {
  int64_t first, n;
  bool mapped;
};

// One sequence: where its rows start, its segment lengths and real lengths.
struct Sequence {
  int64_t q0, k0;         // first row in q / k
  int64_t seg_q, seg_k;   // segment lengths (pad slots included)
  int64_t sq, sk;         // real lengths
  std::vector<Run> runs;  // the segment's query rows in order, as alternating runs
};

// Cuts each sequence's query segment into runs of rows inside and outside the query-row map
// (strictly ascending rows, checked); without a map one mapped run of the whole segment.
void QueryRuns(const AttentionArgs& a, std::vector<Sequence>& seqs) {
  int64_t next = 0;  // index into the map
  for (Sequence& s : seqs) {
    s.runs.clear();
    int64_t row = 0;  // in-sequence
    while (row < s.seg_q) {
      if (a.query_rows == nullptr) {
        s.runs.push_back(Run{0, s.seg_q, true});
        break;
      }
      while (next < a.num_query_rows && a.query_rows[next] < s.q0 + row) ++next;
      const bool mapped = next < a.num_query_rows && a.query_rows[next] == s.q0 + row;
      int64_t end = row;
      if (mapped) {
        while (end < s.seg_q && next < a.num_query_rows && a.query_rows[next] == s.q0 + end) {
          ++end;
          ++next;
        }
      } else {
        end = next < a.num_query_rows ? std::min(s.seg_q, a.query_rows[next] - s.q0) : s.seg_q;
      }
      s.runs.push_back(Run{row, end - row, mapped});
      row = end;
    }
  }
}

absl::Status Sequences(const AttentionArgs& a, std::vector<Sequence>& out) {
  out.resize(a.batch);
  for (int64_t b = 0; b < a.batch; ++b) {
    Sequence& s = out[b];
    s.q0 = a.cu_q_host[b];
    s.k0 = a.cu_k_host[b];
    s.seg_q = a.cu_q_host[b + 1] - s.q0;
    s.seg_k = a.cu_k_host[b + 1] - s.k0;
    s.sq = a.seqused_q != nullptr ? a.seqused_q[b] : s.seg_q;
    s.sk = a.seqused_k != nullptr ? a.seqused_k[b] : s.seg_k;
    if (s.sq < 0 || s.sq > s.seg_q) {
      return absl::InvalidArgumentError(absl::StrCat("VarlenAttention: seqused_q[", b, "] = ", s.sq,
                                                     " is outside [0, ", s.seg_q,
                                                     "] (the segment length of cu_seqlens_q)"));
    }
    if (s.sk < 0 || s.sk > s.seg_k) {
      return absl::InvalidArgumentError(absl::StrCat("VarlenAttention: seqused_k[", b, "] = ", s.sk,
                                                     " is outside [0, ", s.seg_k,
                                                     "] (the segment length of cu_seqlens_k)"));
    }
  }
  if (a.subtree_end != nullptr) {
    for (const Sequence& s : out) {
      for (int64_t i = 0; i < s.sq; ++i) {
        const int64_t t = s.q0 + i;
        if (a.subtree_end[t] <= t || a.subtree_end[t] > s.q0 + s.sq) {
          return absl::InvalidArgumentError(absl::StrCat(
              "VarlenAttention: subtree_end[", t, "] = ", a.subtree_end[t], " is outside [", t + 1,
              ", ", s.q0 + s.sq, "] (past the row, within its sequence)"));
        }
        if (a.positions != nullptr && a.tree_window_left >= 0 &&
            (a.positions[t] < 0 || a.positions[t] > i)) {
          return absl::InvalidArgumentError(absl::StrCat("VarlenAttention: positions[", t,
                                                         "] = ", a.positions[t], " is outside [0, ",
                                                         i, "] (a depth within its sequence)"));
        }
      }
    }
  }
  // The tail (rows past cu[B], kernels.h) as one more sequence without real rows: every tail row
  // is then written like a pad slot (out 0, lse +inf, gradients 0) and is never a key.
  const int64_t tail_q = a.total_q - a.cu_q_host[a.batch];
  const int64_t tail_k = a.total_k - a.cu_k_host[a.batch];
  if (tail_q > 0 || tail_k > 0) {
    out.push_back(Sequence{a.cu_q_host[a.batch], a.cu_k_host[a.batch], tail_q, tail_k, 0, 0, {}});
  }
  QueryRuns(a, out);
  return absl::OkStatus();
}

AttnMask MaskOf(const AttentionArgs& a, const Sequence& s) {
  const AttnTree tree{a.subtree_end, a.positions, a.tree_window_left, s.q0};
  return AttnMask{s.sq, s.sk, a.causal, a.window_left, a.window_right, tree};
}

// A tile of `n` rows starting at row `first` of a sequence; a blank tile's rows are outside the
// query-row map (written as queries that see no key).
struct Tile {
  int64_t seq, head, first, n;
  bool blank;
};

// Tiles of `size` rows over each sequence's segment (pad slots included, so every output row is
// written), for heads [0, heads): over the key segment, or over the query runs (a blank run is
// one tile: it is only written).
std::vector<Tile> Tiles(const std::vector<Sequence>& seqs, int64_t heads, int64_t size, bool keys) {
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < static_cast<int64_t>(seqs.size()); ++b) {
    const std::vector<Run> whole{Run{0, seqs[b].seg_k, true}};
    for (int64_t h = 0; h < heads; ++h) {
      for (const Run& run : keys ? whole : seqs[b].runs) {
        const int64_t step = run.mapped ? size : run.n;
        for (int64_t first = run.first; first < run.first + run.n; first += step) {
          tiles.push_back(
              Tile{b, h, first, std::min(step, run.first + run.n - first), !run.mapped});
        }
      }
    }
  }
  return tiles;
}

// Runs body(item, worker) for every item in [0, n) on up to `threads` threads; items are claimed
// in order from a shared counter. `worker` < threads indexes per-thread scratch.
void ParallelFor(int64_t n, int threads, const std::function<void(int64_t, int)>& body) {
  const int workers = static_cast<int>(std::min<int64_t>(threads, n));
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  auto run = [&](int worker) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(i, worker);
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(run, w);
  run(0);
  for (std::thread& t : pool) t.join();
}

// The typed kernel: T is the storage type, AccT its accumulation type.
template <typename T>
class Attention {
 public:
  using AccT = Acc<T>;

  explicit Attention(const AttentionArgs& a)
      : a_(a),
        d_(a.head_dim),
        group_(a.heads / a.kv_heads),
        scale_(static_cast<AccT>(a.scale)),
        softcap_(static_cast<AccT>(a.softcap)) {}

  void Forward(const std::vector<Sequence>& seqs) {
    const std::vector<Tile> tiles = Tiles(seqs, a_.heads, kBr, /*keys=*/false);
    std::vector<Scratch> scratch(std::max(1, a_.num_threads));
    ParallelFor(static_cast<int64_t>(tiles.size()), a_.num_threads,
                [&](int64_t i, int w) { ForwardTile(seqs[tiles[i].seq], tiles[i], scratch[w]); });
  }

  void Backward(const std::vector<Sequence>& seqs) {
    std::vector<AccT> d_rows(a_.heads * a_.total_q);
    std::vector<Scratch> scratch(std::max(1, a_.num_threads));
    const std::vector<Tile> q_tiles = Tiles(seqs, a_.heads, kBr, /*keys=*/false);
    ParallelFor(static_cast<int64_t>(q_tiles.size()), a_.num_threads, [&](int64_t i, int w) {
      BackwardDq(seqs[q_tiles[i].seq], q_tiles[i], d_rows.data(), scratch[w]);
    });
    const std::vector<Tile> k_tiles = Tiles(seqs, a_.kv_heads, kBc, /*keys=*/true);
    ParallelFor(static_cast<int64_t>(k_tiles.size()), a_.num_threads, [&](int64_t i, int w) {
      BackwardDkDv(seqs[k_tiles[i].seq], k_tiles[i], d_rows.data(), scratch[w]);
    });
  }

 private:
  // Per-thread tile buffers in the accumulation type.
  struct Scratch {
    std::vector<AccT> q, dout, k, v, kt, vt, s, dp, acc_a, acc_b;
  };

  const T* Row(const void* base, int64_t row, int64_t heads, int64_t h) const {
    return static_cast<const T*>(base) + (row * heads + h) * d_;
  }
  T* MutableRow(void* base, int64_t row, int64_t heads, int64_t h) const {
    return static_cast<T*>(base) + (row * heads + h) * d_;
  }
  AccT* Lse() const { return static_cast<AccT*>(a_.lse); }

  // dst[r][d] = src rows [first, first + n) of head h, as AccT, row-major [n][D].
  void LoadRows(const void* src, int64_t heads, int64_t h, int64_t first, int64_t n,
                std::vector<AccT>& dst) const {
    dst.resize(n * d_);
    for (int64_t r = 0; r < n; ++r) {
      const T* row = Row(src, first + r, heads, h);
      for (int64_t d = 0; d < d_; ++d) dst[r * d_ + d] = ToAcc(row[d]);
    }
  }
  // dst[d][c] = src row first + c of head h, transposed [D][kBc].
  void LoadTransposed(const void* src, int64_t heads, int64_t h, int64_t first, int64_t n,
                      std::vector<AccT>& dst) const {
    dst.assign(d_ * kBc, AccT(0));
    for (int64_t c = 0; c < n; ++c) {
      const T* row = Row(src, first + c, heads, h);
      for (int64_t d = 0; d < d_; ++d) dst[d * kBc + c] = ToAcc(row[d]);
    }
  }
  // s[r][c] = a[r] . bt[., c] for r < rows, c < kBc (a: [rows][D], bt: [D][kBc]).
  void MatMulT(const std::vector<AccT>& a, const std::vector<AccT>& bt, int64_t rows,
               std::vector<AccT>& s) const {
    s.assign(rows * kBc, AccT(0));
    for (int64_t r = 0; r < rows; ++r) {
      AccT* out = &s[r * kBc];
      for (int64_t d = 0; d < d_; ++d) {
        const AccT x = a[r * d_ + d];
        const AccT* b = &bt[d * kBc];
        for (int64_t c = 0; c < kBc; ++c) out[c] += x * b[c];
      }
    }
  }
  // acc[r][.] += p[r][c] * b[c][.] over c < cols (acc: [rows][D], p: [rows][kBc], b: [cols][D]).
  void AddMatMul(const std::vector<AccT>& p, const std::vector<AccT>& b, int64_t rows, int64_t cols,
                 std::vector<AccT>& acc) const {
    for (int64_t r = 0; r < rows; ++r) {
      AccT* out = &acc[r * d_];
      for (int64_t c = 0; c < cols; ++c) {
        const AccT x = p[r * kBc + c];
        if (x == AccT(0)) continue;
        const AccT* in = &b[c * d_];
        for (int64_t d = 0; d < d_; ++d) out[d] += x * in[d];
      }
    }
  }
  // acc[c][.] += p[r][c] * b[r][.] over r < rows (the transposed product, for dK and dV).
  void AddMatMulTransposed(const std::vector<AccT>& p, const std::vector<AccT>& b, int64_t rows,
                           int64_t cols, std::vector<AccT>& acc) const {
    for (int64_t r = 0; r < rows; ++r) {
      const AccT* in = &b[r * d_];
      for (int64_t c = 0; c < cols; ++c) {
        const AccT x = p[r * kBc + c];
        if (x == AccT(0)) continue;
        AccT* out = &acc[c * d_];
        for (int64_t d = 0; d < d_; ++d) out[d] += x * in[d];
      }
    }
  }

  // The keys rows [first, first + n) of a sequence can see, as a range of whole key tiles.
  static KeyRange TileKeys(const AttnMask& m, int64_t first, int64_t n) {
    const int64_t last = std::min(first + n, m.sq) - 1;
    if (last < first) return KeyRange{0, 0};
    const KeyRange lo = VisibleKeys(m, first);
    const KeyRange hi = VisibleKeys(m, last);
    if (hi.hi <= lo.lo) return KeyRange{0, 0};
    return KeyRange{lo.lo / kBc * kBc, hi.hi};
  }

  // With a tree: whether no query at or after row `first` sees a key of [key0, key0 + cols),
  // because every key's subtree ends at or before `first` (a sibling branch already closed).
  static bool TreeSkips(const AttnMask& m, int64_t first, int64_t key0, int64_t cols) {
    if (m.tree.subtree_end == nullptr) return false;
    for (int64_t c = 0; c < cols; ++c) {
      if (m.tree.subtree_end[m.tree.row0 + key0 + c] > m.tree.row0 + first) return false;
    }
    return true;
  }

  // Scores of one (query tile, key tile) pair: s[r][c] = AttnScore(q_r . k_c), -inf where masked.
  void Scores(const AttnMask& m, int64_t first, int64_t rows, int64_t key0, int64_t cols,
              std::vector<AccT>& s) const {
    for (int64_t r = 0; r < rows; ++r) {
      const KeyRange keys = VisibleKeys(m, first + r);
      for (int64_t c = 0; c < kBc; ++c) {
        const int64_t j = key0 + c;
        AccT& x = s[r * kBc + c];
        x = c < cols && KeyVisible(m, keys, first + r, j) ? AttnScore(x, scale_, softcap_)
                                                          : -Inf<AccT>();
      }
    }
  }

  void ForwardTile(const Sequence& seq, const Tile& t, Scratch& w) {
    const int64_t h = t.head;
    const int64_t hk = h / group_;
    const AttnMask mask = MaskOf(a_, seq);
    const int64_t rows =  // real rows
        t.blank ? 0 : std::max<int64_t>(0, std::min(t.n, seq.sq - t.first));
    std::vector<AccT>& o = w.acc_a;
    o.assign(t.n * d_, AccT(0));
    std::vector<SoftmaxRow<AccT>> state(t.n, SoftmaxStart<AccT>());
    if (rows > 0) {
      LoadRows(a_.q, a_.heads, h, seq.q0 + t.first, rows, w.q);
      const KeyRange keys = TileKeys(mask, t.first, rows);
      for (int64_t key0 = keys.lo; key0 < keys.hi; key0 += kBc) {
        const int64_t cols = std::min(kBc, seq.sk - key0);
        if (TreeSkips(mask, t.first, key0, cols)) continue;
        LoadTransposed(a_.k, a_.kv_heads, hk, seq.k0 + key0, cols, w.kt);
        LoadRows(a_.v, a_.kv_heads, hk, seq.k0 + key0, cols, w.v);
        MatMulT(w.q, w.kt, rows, w.s);  // S = Q·Kᵀ
        Scores(mask, t.first, rows, key0, cols, w.s);
        for (int64_t r = 0; r < rows; ++r) {
          AccT* s = &w.s[r * kBc];
          AccT tile_max = -Inf<AccT>();
          for (int64_t c = 0; c < kBc; ++c) tile_max = s[c] > tile_max ? s[c] : tile_max;
          const AccT factor = SoftmaxRescale(state[r], tile_max);
          if (factor != AccT(1)) {
            for (int64_t d = 0; d < d_; ++d) o[r * d_ + d] *= factor;
          }
          for (int64_t c = 0; c < kBc; ++c) {
            s[c] = SoftmaxProb(s[c], state[r].max);  // P = exp(S - m)
            state[r].sum += s[c];
          }
        }
        AddMatMul(w.s, w.v, rows, cols, o);  // O += P·V
      }
    }
    for (int64_t r = 0; r < t.n; ++r) {
      const int64_t row = seq.q0 + t.first + r;
      const AccT inv = SoftmaxOutScale(state[r]);
      T* out = MutableRow(a_.out, row, a_.heads, h);
      for (int64_t d = 0; d < d_; ++d) out[d] = FromAcc<T>(o[r * d_ + d] * inv);
      Lse()[h * a_.total_q + row] = SoftmaxLse(state[r]);
    }
  }

  // dS∘(ds/dot) of one (query tile, key tile) pair into w.s, and P into w.dp when `keep_p`.
  // REQUIRES: w.q, w.dout hold the query tile, w.kt, w.vt the key tile (transposed).
  void ScoreGradients(const AttnMask& m, const Sequence& seq, int64_t h, int64_t first,
                      int64_t rows, int64_t key0, int64_t cols, const AccT* d_rows, Scratch& w,
                      bool keep_p) const {
    MatMulT(w.q, w.kt, rows, w.s);  // S = Q·Kᵀ
    Scores(m, first, rows, key0, cols, w.s);
    MatMulT(w.dout, w.vt, rows, w.dp);  // dP = dO·Vᵀ
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = seq.q0 + first + r;
      const AccT lse = Lse()[h * a_.total_q + row];
      const AccT d_row = d_rows[h * a_.total_q + row];
      for (int64_t c = 0; c < kBc; ++c) {
        AccT& s = w.s[r * kBc + c];
        AccT& dpv = w.dp[r * kBc + c];
        const AccT p = ProbFromLse(s, lse);
        const AccT ds = p == AccT(0)
                            ? AccT(0)
                            : ScoreGradient(p, dpv, d_row) * AttnScoreGrad(s, scale_, softcap_);
        s = ds;
        if (keep_p) dpv = p;
      }
    }
  }

  void BackwardDq(const Sequence& seq, const Tile& t, AccT* d_rows, Scratch& w) {
    const int64_t h = t.head;
    const int64_t hk = h / group_;
    const AttnMask mask = MaskOf(a_, seq);
    const int64_t rows = t.blank ? 0 : std::max<int64_t>(0, std::min(t.n, seq.sq - t.first));
    std::vector<AccT>& dq = w.acc_a;
    dq.assign(t.n * d_, AccT(0));
    if (rows > 0) {
      LoadRows(a_.q, a_.heads, h, seq.q0 + t.first, rows, w.q);
      LoadRows(a_.dout, a_.heads, h, seq.q0 + t.first, rows, w.dout);
      for (int64_t r = 0; r < rows; ++r) {  // D = rowsum(dO ∘ O)
        const T* out = Row(a_.out, seq.q0 + t.first + r, a_.heads, h);
        AccT sum = 0;
        for (int64_t d = 0; d < d_; ++d) sum += w.dout[r * d_ + d] * ToAcc(out[d]);
        d_rows[h * a_.total_q + seq.q0 + t.first + r] = sum;
      }
      const KeyRange keys = TileKeys(mask, t.first, rows);
      for (int64_t key0 = keys.lo; key0 < keys.hi; key0 += kBc) {
        const int64_t cols = std::min(kBc, seq.sk - key0);
        if (TreeSkips(mask, t.first, key0, cols)) continue;
        LoadTransposed(a_.k, a_.kv_heads, hk, seq.k0 + key0, cols, w.kt);
        LoadTransposed(a_.v, a_.kv_heads, hk, seq.k0 + key0, cols, w.vt);
        LoadRows(a_.k, a_.kv_heads, hk, seq.k0 + key0, cols, w.k);
        ScoreGradients(mask, seq, h, t.first, rows, key0, cols, d_rows, w, /*keep_p=*/false);
        AddMatMul(w.s, w.k, rows, cols, dq);  // dQ += dS·K
      }
    }
    for (int64_t r = 0; r < t.n; ++r) {
      T* out = MutableRow(a_.dq, seq.q0 + t.first + r, a_.heads, h);
      for (int64_t d = 0; d < d_; ++d) out[d] = FromAcc<T>(dq[r * d_ + d]);
    }
  }

  void BackwardDkDv(const Sequence& seq, const Tile& t, const AccT* d_rows, Scratch& w) {
    const int64_t hk = t.head;
    const AttnMask mask = MaskOf(a_, seq);
    const int64_t key0 = t.first;
    const int64_t cols = std::max<int64_t>(0, std::min(t.n, seq.sk - key0));  // real keys
    std::vector<AccT>& dk = w.acc_a;
    std::vector<AccT>& dv = w.acc_b;
    dk.assign(t.n * d_, AccT(0));
    dv.assign(t.n * d_, AccT(0));
    if (cols > 0) {
      LoadTransposed(a_.k, a_.kv_heads, hk, seq.k0 + key0, cols, w.kt);
      LoadTransposed(a_.v, a_.kv_heads, hk, seq.k0 + key0, cols, w.vt);
      for (int64_t h = hk * group_; h < (hk + 1) * group_; ++h) {
        for (const Run& run : seq.runs) {
          if (!run.mapped) continue;
          const int64_t end = std::min(run.first + run.n, seq.sq);
          bool later_see_none = false;
          for (int64_t first = run.first; first < end; first += kBr) {
            const int64_t rows = std::min(kBr, end - first);
            const KeyRange keys = TileKeys(mask, first, rows);
            if (keys.hi <= key0 || keys.lo >= key0 + cols) continue;  // sees none of ours
            if (TreeSkips(mask, first, key0, cols)) {                 // nor does any later tile
              later_see_none = true;
              break;
            }
            LoadRows(a_.q, a_.heads, h, seq.q0 + first, rows, w.q);
            LoadRows(a_.dout, a_.heads, h, seq.q0 + first, rows, w.dout);
            ScoreGradients(mask, seq, h, first, rows, key0, cols, d_rows, w, /*keep_p=*/true);
            AddMatMulTransposed(w.dp, w.dout, rows, cols, dv);  // dV += Pᵀ·dO
            AddMatMulTransposed(w.s, w.q, rows, cols, dk);      // dK += dSᵀ·Q
          }
          if (later_see_none) break;
        }
      }
    }
    for (int64_t c = 0; c < t.n; ++c) {
      T* out_k = MutableRow(a_.dk, seq.k0 + key0 + c, a_.kv_heads, hk);
      T* out_v = MutableRow(a_.dv, seq.k0 + key0 + c, a_.kv_heads, hk);
      for (int64_t d = 0; d < d_; ++d) {
        out_k[d] = FromAcc<T>(dk[c * d_ + d]);
        out_v[d] = FromAcc<T>(dv[c * d_ + d]);
      }
    }
  }

  const AttentionArgs& a_;
  const int64_t d_;
  const int64_t group_;
  const AccT scale_;
  const AccT softcap_;
};

template <template <typename> class Fn>
void ByDtype(FloatType dtype, const AttentionArgs& a, const std::vector<Sequence>& seqs) {
  switch (dtype) {
    case FloatType::kF16:
      return Fn<Fp16>::Run(a, seqs);
    case FloatType::kBf16:
      return Fn<Bf16>::Run(a, seqs);
    case FloatType::kF32:
      return Fn<float>::Run(a, seqs);
    case FloatType::kF64:
      return Fn<double>::Run(a, seqs);
  }
}

template <typename T>
struct RunForward {
  static void Run(const AttentionArgs& a, const std::vector<Sequence>& seqs) {
    Attention<T>(a).Forward(seqs);
  }
};
template <typename T>
struct RunBackward {
  static void Run(const AttentionArgs& a, const std::vector<Sequence>& seqs) {
    Attention<T>(a).Backward(seqs);
  }
};

}  // namespace

absl::Status AttentionForward(const AttentionArgs& a) {
  std::vector<Sequence> seqs;
  if (absl::Status s = Sequences(a, seqs); !s.ok()) return s;
  ByDtype<RunForward>(a.dtype, a, seqs);
  return absl::OkStatus();
}

absl::Status AttentionBackward(const AttentionArgs& a) {
  std::vector<Sequence> seqs;
  if (absl::Status s = Sequences(a, seqs); !s.ok()) return s;
  ByDtype<RunBackward>(a.dtype, a, seqs);
  return absl::OkStatus();
}

}  // namespace packsched::kernels::internal::cpu
