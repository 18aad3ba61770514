// packsched._kernels: the pybind11 layer under packsched/kernels.py. It takes already-allocated
// DLPack producers (the Python wrapper allocates outputs with the inputs' own library), borrows
// their DLTensor views for the duration of one call, runs the C++ call without the GIL (so other
// Python threads run meanwhile), and raises ValueError with the C++ message when a call returns an
// error status.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dlpack/dlpack.h"
#include "packsched/kernels/attention.h"
#include "packsched/kernels/context_parallel.h"
#include "packsched/kernels/kernels.h"
#include "packsched/kernels/recurrent.h"
#include "packsched/kernels/tree.h"

namespace py = pybind11;

namespace packsched::kernels {
namespace {

// A borrowed DLTensor view of a Python object that implements __dlpack__. The capsule keeps the
// producer's buffer alive; it is not consumed (not renamed), so the producer's own capsule
// destructor releases it.
class Borrowed {
 public:
  Borrowed(const py::object& obj, uintptr_t stream) {
    if (!py::hasattr(obj, "__dlpack__")) {
      throw py::type_error("expected a DLPack producer (an object with __dlpack__), got " +
                           std::string(py::str(py::type::of(obj))));
    }
    const bool on_cuda =
        py::hasattr(obj, "__dlpack_device__") &&
        obj.attr("__dlpack_device__")().cast<py::tuple>()[0].cast<int>() == kDLCUDA;
    // For a CUDA producer, naming our stream lets it order its pending work before ours.
    capsule_ = on_cuda && stream != 0 ? obj.attr("__dlpack__")(py::arg("stream") = stream)
                                      : obj.attr("__dlpack__")();
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule_.ptr(), "dltensor"));
    if (managed == nullptr) throw py::error_already_set();
    tensor_ = &managed->dl_tensor;
  }
  const DLTensor& operator*() const { return *tensor_; }
  const DLTensor* get() const { return tensor_; }

 private:
  py::object capsule_;
  const DLTensor* tensor_;
};

void Check(const absl::Status& s) {
  if (!s.ok()) throw py::value_error(std::string(s.message()));
}

// Runs one kernel call without the GIL, then raises its error (with the GIL). `call` must touch
// only C++ state: the DLTensor views of Borrowed objects, host vectors, plain values. It may
// release the GIL because everything it reads is owned by objects of the calling frame that
// outlive it (the Borrowed capsules keep the producers' buffers alive, and their destructors run
// after the GIL is re-acquired). Other Python threads may run meanwhile; as with any torch op
// that releases the GIL, they must not resize or free these tensors' storage during the call.
template <typename Call>
void CheckWithoutGil(Call call) {
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = call();
  }
  Check(s);
}

Stream AsStream(uintptr_t s) { return reinterpret_cast<Stream>(s); }

absl::Span<const int32_t> HostSpan(const std::optional<std::vector<int32_t>>& v) {
  return v ? absl::MakeConstSpan(*v) : absl::Span<const int32_t>();
}

// The layout and options of an attention call, with the borrowed views they point into.
struct AttentionCall {
  AttentionCall(const py::object& cu_q, const std::optional<std::vector<int32_t>>& cu_q_host,
                const py::object& cu_k, const std::optional<std::vector<int32_t>>& cu_k_host,
                int64_t rows_q, int64_t rows_k, int64_t max_q, int64_t max_k,
                const py::object& seqused_q, const py::object& seqused_k,
                std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
                double softcap, const py::object& subtree_end, const py::object& positions,
                const py::object& query_rows, uintptr_t stream)
      : bq(cu_q, stream), bk(cu_k, stream), host_q(cu_q_host), host_k(cu_k_host) {
    if (!seqused_q.is_none()) bsq.emplace(seqused_q, stream);
    if (!seqused_k.is_none()) bsk.emplace(seqused_k, stream);
    if (!subtree_end.is_none()) bse.emplace(subtree_end, stream);
    if (!positions.is_none()) bpos.emplace(positions, stream);
    if (!query_rows.is_none()) brows.emplace(query_rows, stream);
    seqlens.query_rows = brows ? brows->get() : nullptr;
    seqlens.subtree_end = bse ? bse->get() : nullptr;
    seqlens.positions = bpos ? bpos->get() : nullptr;
    seqlens.q = {bq.get(), HostSpan(host_q), rows_q};
    seqlens.k = {bk.get(), HostSpan(host_k), rows_k};
    seqlens.max_seqlen_q = max_q;
    seqlens.max_seqlen_k = max_k;
    seqlens.seqused_q = bsq ? bsq->get() : nullptr;
    seqlens.seqused_k = bsk ? bsk->get() : nullptr;
    options.softmax_scale = scale;
    options.causal = causal;
    options.window_left = window_left;
    options.window_right = window_right;
    options.softcap = softcap;
  }
  Borrowed bq, bk;
  std::optional<Borrowed> bsq, bsk, bse, bpos, brows;
  const std::optional<std::vector<int32_t>>&host_q, host_k;
  AttentionSeqlens seqlens;
  AttentionOptions options;
};

PYBIND11_MODULE(_kernels, m) {
  m.doc() = "Low-level bindings of the packsched kernels; use packsched.kernels instead.";
  m.def("built_with_cuda", &BuiltWithCuda);

  m.def(
      "aligned_cu_seqlens",
      [](const std::vector<int32_t>& cu, int64_t align) {
        auto r = AlignedCuSeqlens(cu, align);
        Check(r.status());
        return *r;
      },
      py::arg("cu_seqlens"), py::arg("align"));

  m.def(
      "unpad",
      [](const py::object& x, const py::object& mask, const py::object& cu,
         const std::optional<std::vector<int32_t>>& cu_host, const py::object& x_packed,
         const py::object& indices, uintptr_t stream) {
        Borrowed bx(x, stream), bm(mask, stream), bc(cu, stream), bp(x_packed, stream),
            bi(indices, stream);
        CheckWithoutGil([&] {
          return Unpad(*bx, *bm, {bc.get(), HostSpan(cu_host)}, *bp, *bi, AsStream(stream));
        });
      },
      py::arg("x"), py::arg("mask"), py::arg("cu_seqlens"), py::arg("cu_seqlens_host"),
      py::arg("x_packed"), py::arg("indices"), py::arg("stream"));

  m.def(
      "pad",
      [](const py::object& x_packed, const py::object& indices, const py::object& x,
         uintptr_t stream) {
        Borrowed bp(x_packed, stream), bi(indices, stream), bx(x, stream);
        CheckWithoutGil([&] { return Pad(*bp, *bi, *bx, AsStream(stream)); });
      },
      py::arg("x_packed"), py::arg("indices"), py::arg("x"), py::arg("stream"));

  m.def(
      "pack_aligned",
      [](const py::object& x_packed, const py::object& cu,
         const std::optional<std::vector<int32_t>>& cu_host, int64_t align, int64_t rows,
         double pad_value, const py::object& x_aligned, const py::object& cu_padded,
         const py::object& seqused, uintptr_t stream) {
        Borrowed bp(x_packed, stream), bc(cu, stream), ba(x_aligned, stream),
            bcp(cu_padded, stream), bs(seqused, stream);
        CheckWithoutGil([&] {
          return PackAligned(*bp, {bc.get(), HostSpan(cu_host)}, align, rows, pad_value, *ba, *bcp,
                             *bs, AsStream(stream));
        });
      },
      py::arg("x_packed"), py::arg("cu_seqlens"), py::arg("cu_seqlens_host"), py::arg("align"),
      py::arg("rows"), py::arg("pad_value"), py::arg("x_aligned"), py::arg("cu_seqlens_padded"),
      py::arg("seqused"), py::arg("stream"));

  m.def(
      "unpack_aligned",
      [](const py::object& x_aligned, const py::object& cu,
         const std::optional<std::vector<int32_t>>& cu_host, const py::object& cu_padded,
         const std::optional<std::vector<int32_t>>& cu_padded_host, int64_t rows,
         const py::object& x_packed, uintptr_t stream) {
        Borrowed ba(x_aligned, stream), bc(cu, stream), bcp(cu_padded, stream),
            bp(x_packed, stream);
        CheckWithoutGil([&] {
          return UnpackAligned(*ba, {bc.get(), HostSpan(cu_host)},
                               {bcp.get(), HostSpan(cu_padded_host), rows}, *bp, AsStream(stream));
        });
      },
      py::arg("x_aligned"), py::arg("cu_seqlens"), py::arg("cu_seqlens_host"),
      py::arg("cu_seqlens_padded"), py::arg("cu_seqlens_padded_host"), py::arg("rows"),
      py::arg("x_packed"), py::arg("stream"));

  m.def(
      "position_ids",
      [](const py::object& cu, const std::optional<std::vector<int32_t>>& cu_host, int64_t rows,
         const py::object& out, uintptr_t stream) {
        Borrowed bc(cu, stream), bo(out, stream);
        CheckWithoutGil([&] {
          return PositionIds({bc.get(), HostSpan(cu_host), rows}, *bo, AsStream(stream));
        });
      },
      py::arg("cu_seqlens"), py::arg("cu_seqlens_host"), py::arg("rows"), py::arg("position_ids"),
      py::arg("stream"));

  m.def(
      "cp_shard",
      [](const py::object& x, const py::object& cu,
         const std::optional<std::vector<int32_t>>& cu_host, int64_t cp, int64_t rank,
         const py::object& shard, uintptr_t stream) {
        Borrowed bx(x, stream), bc(cu, stream), bs(shard, stream);
        CheckWithoutGil([&] {
          return CpShard(*bx, {bc.get(), HostSpan(cu_host)}, cp, rank, *bs, AsStream(stream));
        });
      },
      py::arg("x"), py::arg("cu_seqlens"), py::arg("cu_seqlens_host"), py::arg("cp"),
      py::arg("rank"), py::arg("shard"), py::arg("stream"));

  m.def(
      "cp_unshard",
      [](const py::object& shard, const py::object& cu,
         const std::optional<std::vector<int32_t>>& cu_host, int64_t cp, int64_t rank,
         const py::object& x, uintptr_t stream) {
        Borrowed bs(shard, stream), bc(cu, stream), bx(x, stream);
        CheckWithoutGil([&] {
          return CpUnshard(*bs, {bc.get(), HostSpan(cu_host)}, cp, rank, *bx, AsStream(stream));
        });
      },
      py::arg("shard"), py::arg("cu_seqlens"), py::arg("cu_seqlens_host"), py::arg("cp"),
      py::arg("rank"), py::arg("x"), py::arg("stream"));

  m.def(
      "mrope_position_ids",
      [](const py::object& types, const py::object& cu,
         const std::optional<std::vector<int32_t>>& cu_host, int64_t rows, const py::object& grids,
         const py::object& grid_cu, const std::optional<std::vector<int32_t>>& grid_cu_host,
         int64_t merge, const py::object& out, uintptr_t stream) {
        Borrowed bt(types, stream), bc(cu, stream), bg(grids, stream), bgc(grid_cu, stream),
            bo(out, stream);
        CheckWithoutGil([&] {
          return MropePositionIds(*bt, {bc.get(), HostSpan(cu_host), rows}, *bg,
                                  {bgc.get(), HostSpan(grid_cu_host)}, merge, *bo,
                                  AsStream(stream));
        });
      },
      py::arg("token_types"), py::arg("cu_seqlens"), py::arg("cu_seqlens_host"), py::arg("rows"),
      py::arg("grid_thw"), py::arg("grid_cu_seqlens"), py::arg("grid_cu_seqlens_host"),
      py::arg("spatial_merge_size"), py::arg("position_ids"), py::arg("stream"));

  m.def(
      "shift_labels",
      [](const py::object& ids, const py::object& cu,
         const std::optional<std::vector<int32_t>>& cu_host, const py::object& cu_padded,
         const std::optional<std::vector<int32_t>>& cu_padded_host, int64_t rows,
         int64_t ignore_index, const py::object& labels, uintptr_t stream) {
        Borrowed bi(ids, stream), bc(cu, stream), bl(labels, stream);
        std::optional<Borrowed> bcp;
        Seqlens padded;
        if (!cu_padded.is_none()) {
          bcp.emplace(cu_padded, stream);
          padded = {bcp->get(), HostSpan(cu_padded_host), rows};
        }
        // `rows` declares the tail of the layout of ids: the padded offsets when given.
        const Seqlens real{bc.get(), HostSpan(cu_host), bcp ? -1 : rows};
        CheckWithoutGil([&] {
          return ShiftLabels(*bi, real, bcp ? &padded : nullptr, ignore_index, *bl,
                             AsStream(stream));
        });
      },
      py::arg("ids"), py::arg("cu_seqlens"), py::arg("cu_seqlens_host"),
      py::arg("cu_seqlens_padded"), py::arg("cu_seqlens_padded_host"), py::arg("rows"),
      py::arg("ignore_index"), py::arg("labels"), py::arg("stream"));

  m.def(
      "packed_cross_entropy",
      [](const py::object& logits, const py::object& labels, const py::object& cu,
         const std::optional<std::vector<int32_t>>& cu_host, int64_t rows, int64_t ignore_index,
         const py::object& loss, const py::object& sums, const py::object& counts,
         uintptr_t stream) {
        Borrowed bl(logits, stream), bt(labels, stream), bc(cu, stream), bo(loss, stream),
            bs(sums, stream), bn(counts, stream);
        CheckWithoutGil([&] {
          return PackedCrossEntropy(*bl, *bt, {bc.get(), HostSpan(cu_host), rows}, ignore_index,
                                    *bo, *bs, *bn, AsStream(stream));
        });
      },
      py::arg("logits"), py::arg("labels"), py::arg("cu_seqlens"), py::arg("cu_seqlens_host"),
      py::arg("rows"), py::arg("ignore_index"), py::arg("per_token_loss"),
      py::arg("per_sequence_sum"), py::arg("per_sequence_count"), py::arg("stream"));

  m.def(
      "varlen_attention_forward",
      [](const py::object& q, const py::object& k, const py::object& v, const py::object& cu_q,
         const std::optional<std::vector<int32_t>>& cu_q_host, const py::object& cu_k,
         const std::optional<std::vector<int32_t>>& cu_k_host, int64_t rows_q, int64_t rows_k,
         int64_t max_q, int64_t max_k, const py::object& seqused_q, const py::object& seqused_k,
         std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
         double softcap, const py::object& out, const py::object& lse, uintptr_t stream,
         const py::object& subtree_end, const py::object& positions, const py::object& query_rows) {
        Borrowed bq(q, stream), bk(k, stream), bv(v, stream), bo(out, stream), bl(lse, stream);
        AttentionCall c(cu_q, cu_q_host, cu_k, cu_k_host, rows_q, rows_k, max_q, max_k, seqused_q,
                        seqused_k, scale, causal, window_left, window_right, softcap, subtree_end,
                        positions, query_rows, stream);
        CheckWithoutGil([&] {
          return VarlenAttentionForward(*bq, *bk, *bv, c.seqlens, c.options, *bo, *bl,
                                        AsStream(stream));
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens_q"),
      py::arg("cu_seqlens_q_host"), py::arg("cu_seqlens_k"), py::arg("cu_seqlens_k_host"),
      py::arg("rows_q"), py::arg("rows_k"), py::arg("max_seqlen_q"), py::arg("max_seqlen_k"),
      py::arg("seqused_q"), py::arg("seqused_k"), py::arg("softmax_scale"), py::arg("causal"),
      py::arg("window_left"), py::arg("window_right"), py::arg("softcap"), py::arg("out"),
      py::arg("lse"), py::arg("stream"), py::arg("subtree_end") = py::none(),
      py::arg("positions") = py::none(), py::arg("query_rows") = py::none());

  m.def(
      "varlen_attention_backward",
      [](const py::object& dout, const py::object& q, const py::object& k, const py::object& v,
         const py::object& out, const py::object& lse, const py::object& cu_q,
         const std::optional<std::vector<int32_t>>& cu_q_host, const py::object& cu_k,
         const std::optional<std::vector<int32_t>>& cu_k_host, int64_t rows_q, int64_t rows_k,
         int64_t max_q, int64_t max_k, const py::object& seqused_q, const py::object& seqused_k,
         std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
         double softcap, const py::object& dq, const py::object& dk, const py::object& dv,
         uintptr_t stream, const py::object& subtree_end, const py::object& positions,
         const py::object& query_rows) {
        Borrowed bdo(dout, stream), bq(q, stream), bk(k, stream), bv(v, stream), bo(out, stream),
            bl(lse, stream), bdq(dq, stream), bdk(dk, stream), bdv(dv, stream);
        AttentionCall c(cu_q, cu_q_host, cu_k, cu_k_host, rows_q, rows_k, max_q, max_k, seqused_q,
                        seqused_k, scale, causal, window_left, window_right, softcap, subtree_end,
                        positions, query_rows, stream);
        CheckWithoutGil([&] {
          return VarlenAttentionBackward(*bdo, *bq, *bk, *bv, *bo, *bl, c.seqlens, c.options, *bdq,
                                         *bdk, *bdv, AsStream(stream));
        });
      },
      py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
      py::arg("cu_seqlens_q"), py::arg("cu_seqlens_q_host"), py::arg("cu_seqlens_k"),
      py::arg("cu_seqlens_k_host"), py::arg("rows_q"), py::arg("rows_k"), py::arg("max_seqlen_q"),
      py::arg("max_seqlen_k"), py::arg("seqused_q"), py::arg("seqused_k"), py::arg("softmax_scale"),
      py::arg("causal"), py::arg("window_left"), py::arg("window_right"), py::arg("softcap"),
      py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("stream"),
      py::arg("subtree_end") = py::none(), py::arg("positions") = py::none(),
      py::arg("query_rows") = py::none());

  m.def(
      "tree_position_ids",
      [](const py::object& cu, const std::optional<std::vector<int32_t>>& cu_host, int64_t rows,
         const py::object& subtree_end, const py::object& out, uintptr_t stream) {
        Borrowed bc(cu, stream), bs(subtree_end, stream), bo(out, stream);
        CheckWithoutGil([&] {
          return TreePositionIds({bc.get(), HostSpan(cu_host), rows}, *bs, *bo, AsStream(stream));
        });
      },
      py::arg("cu_seqlens"), py::arg("cu_seqlens_host"), py::arg("rows"), py::arg("subtree_end"),
      py::arg("position_ids"), py::arg("stream"));

  m.def(
      "multi_target_cross_entropy",
      [](const py::object& logits, const py::object& rows, const py::object& labels,
         const py::object& loss, const py::object& row_lse, uintptr_t stream) {
        Borrowed bl(logits, stream), br(rows, stream), bt(labels, stream), bo(loss, stream),
            bs(row_lse, stream);
        CheckWithoutGil(
            [&] { return MultiTargetCrossEntropy(*bl, *br, *bt, *bo, *bs, AsStream(stream)); });
      },
      py::arg("logits"), py::arg("rows"), py::arg("labels"), py::arg("loss"), py::arg("row_lse"),
      py::arg("stream"));

  m.def(
      "multi_target_cross_entropy_backward",
      [](const py::object& logits, const py::object& row_lse, const py::object& rows,
         const py::object& labels, const py::object& d_loss, const py::object& d_logits,
         uintptr_t stream) {
        Borrowed bl(logits, stream), bs(row_lse, stream), br(rows, stream), bt(labels, stream),
            bd(d_loss, stream), bo(d_logits, stream);
        CheckWithoutGil([&] {
          return MultiTargetCrossEntropyBackward(*bl, *bs, *br, *bt, *bd, *bo, AsStream(stream));
        });
      },
      py::arg("logits"), py::arg("row_lse"), py::arg("rows"), py::arg("labels"), py::arg("d_loss"),
      py::arg("d_logits"), py::arg("stream"));

  // The recurrent kernels (recurrent.h); None stands for an absent bias / beta.
  m.def(
      "causal_conv1d_forward",
      [](const py::object& x, const py::object& weight, const py::object& bias,
         const py::object& prev_row, bool silu, const py::object& out, uintptr_t stream) {
        Borrowed bx(x, stream), bw(weight, stream), bp(prev_row, stream), bo(out, stream);
        std::optional<Borrowed> bb;
        if (!bias.is_none()) bb.emplace(bias, stream);
        CheckWithoutGil([&] {
          return CausalConv1dForward(*bx, *bw, bb ? bb->get() : nullptr, *bp, silu, *bo,
                                     AsStream(stream));
        });
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("prev_row"), py::arg("silu"),
      py::arg("out"), py::arg("stream"));

  m.def(
      "causal_conv1d_backward",
      [](const py::object& x, const py::object& weight, const py::object& bias,
         const py::object& prev_row, bool silu, const py::object& d_out, const py::object& dx,
         const py::object& d_weight, const py::object& d_bias, uintptr_t stream) {
        Borrowed bx(x, stream), bw(weight, stream), bp(prev_row, stream), bd(d_out, stream),
            bdx(dx, stream), bdw(d_weight, stream);
        std::optional<Borrowed> bb, bdb;
        if (!bias.is_none()) bb.emplace(bias, stream);
        if (!d_bias.is_none()) bdb.emplace(d_bias, stream);
        CheckWithoutGil([&] {
          return CausalConv1dBackward(*bx, *bw, bb ? bb->get() : nullptr, *bp, silu, *bd, *bdx,
                                      *bdw, bdb ? bdb->get() : nullptr, AsStream(stream));
        });
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("prev_row"), py::arg("silu"),
      py::arg("d_out"), py::arg("dx"), py::arg("d_weight"), py::arg("d_bias"), py::arg("stream"));

  m.def(
      "gated_recurrence_forward",
      [](const py::object& q, const py::object& k, const py::object& v, const py::object& g,
         const py::object& beta, const py::object& prev_row, const py::object& out,
         uintptr_t stream) {
        Borrowed bq(q, stream), bk(k, stream), bv(v, stream), bg(g, stream), bp(prev_row, stream),
            bo(out, stream);
        std::optional<Borrowed> bb;
        if (!beta.is_none()) bb.emplace(beta, stream);
        CheckWithoutGil([&] {
          return GatedRecurrenceForward(*bq, *bk, *bv, *bg, bb ? bb->get() : nullptr, *bp, *bo,
                                        AsStream(stream));
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"), py::arg("prev_row"),
      py::arg("out"), py::arg("stream"));

  m.def(
      "gated_recurrence_backward",
      [](const py::object& q, const py::object& k, const py::object& v, const py::object& g,
         const py::object& beta, const py::object& prev_row, const py::object& d_out,
         const py::object& dq, const py::object& dk, const py::object& dv, const py::object& dg,
         const py::object& d_beta, uintptr_t stream) {
        Borrowed bq(q, stream), bk(k, stream), bv(v, stream), bg(g, stream), bp(prev_row, stream),
            bd(d_out, stream), bdq(dq, stream), bdk(dk, stream), bdv(dv, stream), bdg(dg, stream);
        std::optional<Borrowed> bb, bdb;
        if (!beta.is_none()) bb.emplace(beta, stream);
        if (!d_beta.is_none()) bdb.emplace(d_beta, stream);
        CheckWithoutGil([&] {
          return GatedRecurrenceBackward(*bq, *bk, *bv, *bg, bb ? bb->get() : nullptr, *bp, *bd,
                                         *bdq, *bdk, *bdv, *bdg, bdb ? bdb->get() : nullptr,
                                         AsStream(stream));
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"), py::arg("prev_row"),
      py::arg("d_out"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("dg"),
      py::arg("d_beta"), py::arg("stream"));
}

}  // namespace
}  // namespace packsched::kernels
