// The plain C++ interface of the compiled CUDA kernels (kernels/*.cu): no CUDA header is needed to
// include it. Every call returns a Status (a cudaError_t value, 0 for success) and runs on `stream`.
#pragma once
#include <cstddef>
#include <cstdint>

namespace stagecraft::cuda::abi {

/// A cudaError_t (0 = success); error_string() names it.
using Status = int;
/// cudaErrorNotSupported: a call that cannot do what was asked (the caller has another way).
inline constexpr Status not_supported = 801;
/// A cudaStream_t, opaque here.
using Stream = void*;

/// The element types, numbered as stagecraft::DType (b8 i32 i64 f32 f64).
enum class DT : int { b8 = 0, i32 = 1, i64 = 2, f32 = 3, f64 = 4 };

/// Ranks up to core/shape.hpp's max_rank.
inline constexpr int max_rank = 8;

/// Up to three operands read over a contiguous row-major output of `shape`: operand k's element
/// for output index (i0..ir-1) is at sum(i_j * strides[k][j]) elements; a broadcast axis has
/// stride 0.
struct Geometry {
  int rank = 0;
  std::int64_t numel = 0;
  std::int64_t shape[max_rank] = {};
  std::int64_t strides[3][max_rank] = {};
  bool contiguous = false;  ///< every operand is dense in the output's order (a flat loop)
};

/// The unary rules of ops/rules.hpp the kernels are instantiated from (the list is the only copy
/// of their names; their math is the rules themselves).
#define SC_CUDA_UNARY_RULES(X) \
  X(Neg) X(Abs) X(Square) X(Relu) X(Sign) X(Exp) X(Log) X(Sqrt) X(Tanh) X(Sigmoid) X(Sin) X(Cos) X(Log1p) \
  X(Expm1) X(Erf) X(Floor) X(Ceil) X(Round) X(LogicalNot)
/// The binary rules, as SC_CUDA_UNARY_RULES.
#define SC_CUDA_BINARY_RULES(X)                                                                        \
  X(Add) X(Sub) X(Mul) X(Div) X(Pow) X(Maximum) X(Minimum) X(FloorDiv) X(Mod) X(Less) X(LessEqual) X(Greater) \
  X(GreaterEqual) X(Equal) X(NotEqual) X(LogicalAnd) X(LogicalOr) X(ReluGrad)

#define SC_CUDA_ENUM_ITEM(R) R,
/// Which unary rule a kernel applies.
enum class UnaryRule : int { SC_CUDA_UNARY_RULES(SC_CUDA_ENUM_ITEM) count };
/// Which binary rule a kernel applies.
enum class BinaryRule : int { SC_CUDA_BINARY_RULES(SC_CUDA_ENUM_ITEM) count };
#undef SC_CUDA_ENUM_ITEM

/// The reductions; argmax/argmin give i64 indices (their geometry reduces one axis).
enum class ReduceRule : int { sum, max, min, argmax, argmin };

/// x's elements reduced over some axes: output element o (contiguous, `out_numel` of them) reads
/// the input at offset(o over kept_shape/kept_strides) + offset(r over red_shape/red_strides) for
/// r in [0, red_numel).
struct ReduceGeometry {
  int kept_rank = 0, red_rank = 0;
  std::int64_t out_numel = 0, red_numel = 0;
  std::int64_t kept_shape[max_rank] = {}, kept_strides[max_rank] = {};
  std::int64_t red_shape[max_rank] = {}, red_strides[max_rank] = {};
};

/// How a reduction of `rows` outputs over `inner` elements each is cut for the GPU: each output's
/// elements in `chunks` pieces of `chunk` (the last one shorter, none empty), a piece per block;
/// chunks == 1: one block per output. A few long rows (a sum over a whole tensor) would otherwise
/// leave all but a few of the GPU's blocks idle; cut, the pieces' partials go to a scratch buffer
/// and a second kernel combines them. The eager reductions (reduce) and the generated fused ones
/// (graph/cuda_fused.hpp) cut alike.
struct ReduceSplit {
  std::int64_t chunks = 1, chunk = 0;
};
/// A piece has at least this many elements (16 for each of a block's 256 threads)...
inline constexpr std::int64_t split_min_piece = 4096;
/// ...and a reduction is cut into about this many pieces (blocks) at most: enough to keep every SM
/// of an H100 (132) busy with several blocks each.
inline constexpr std::int64_t split_pieces = 1024;

inline ReduceSplit reduce_split(std::int64_t rows, std::int64_t inner) noexcept {
  if (rows <= 0 || inner < 2 * split_min_piece || rows >= split_pieces) return {1, inner};
  const std::int64_t by_size = inner / split_min_piece, by_count = (split_pieces + rows - 1) / rows;
  const std::int64_t want = by_size < by_count ? by_size : by_count;
  if (want < 2) return {1, inner};
  std::int64_t chunk = (inner + want - 1) / want;
  chunk = (chunk + 255) / 256 * 256;  // pieces start on a block's width
  return {(inner + chunk - 1) / chunk, chunk};
}

/// Bytes of scratch reduce() needs for g: room for every piece's partial (a value, or an argmax
/// candidate of value and index, 16 bytes at most) when g is cut; 0 when it is not.
inline std::int64_t reduce_scratch_bytes(const ReduceGeometry& g) noexcept {
  const ReduceSplit s = reduce_split(g.out_numel, g.red_numel);
  return s.chunks > 1 ? g.out_numel * s.chunks * 16 : 0;
}

/// A (batched) row-major product C[b] = op(A[b]) op(B[b]), C of M x N, op(A) M x K, op(B) K x N;
/// A stored K x M when ta (read transposed, not copied), B stored N x K when tb. Batch b reads A at
/// a_offsets[b] (elements; or b * a_stride when a_offsets is null), B alike; C[b] at b * M * N.
struct GemmArgs {
  std::int64_t M = 0, N = 0, K = 0, batch = 1;
  bool ta = false, tb = false;
  std::int64_t a_stride = 0, b_stride = 0;
  const std::int64_t* a_offsets = nullptr;  ///< host array of `batch` offsets, or null
  const std::int64_t* b_offsets = nullptr;
};

/// A sliding window over NCHW images (ops::Window): kernel kh x kw, one stride and one zero
/// padding for both axes, output Ho x Wo.
struct ConvGeometry {
  std::int64_t N = 0, C = 0, H = 0, W = 0, kh = 1, kw = 1, stride = 1, pad = 0, Ho = 0, Wo = 0;
};

// ---- runtime ---------------------------------------------------------------------------------
/// The number of usable GPUs (0 without a driver or device: never fails).
int device_count() noexcept;
/// The message of a Status ("out of memory", ...).
const char* error_string(Status s) noexcept;
/// True for the status of a failed allocation (cudaErrorMemoryAllocation).
bool is_out_of_memory(Status s) noexcept;
/// The device's stream (created on first use): every kernel and copy of that device runs on it
/// (while this thread captures a graph on the device: the capture's stream, see capture_begin).
Status stream(int device, Stream* out) noexcept;
/// Waits until the device's stream has finished its work.
Status synchronize(int device) noexcept;
/// The last asynchronous error of a kernel launch, if any, cleared.
Status last_error() noexcept;

// ---- memory --------------------------------------------------------------------------------
/// n bytes of device memory, ordered on the device's stream (cudaMallocAsync).
Status malloc_async(int device, std::size_t n, void** p) noexcept;
/// Returns memory from malloc_async, ordered on the device's stream.
Status free_async(int device, void* p) noexcept;
/// Waits for the device's stream and gives the memory its pool holds back to the driver (what an
/// out-of-memory retry needs after the caller's cache has been freed).
Status trim_pool(int device) noexcept;
/// Host to device: `src` is staged through a pinned buffer, so the call returns before the copy ends.
Status copy_h2d(int device, void* dst, const void* src, std::size_t n) noexcept;
/// Device to host: waits for the copy (the host needs the bytes).
Status copy_d2h(int device, void* dst, const void* src, std::size_t n) noexcept;
/// Device to device, on the stream of `dst_device` (peer copy when the devices differ).
Status copy_d2d(int dst_device, void* dst, int src_device, const void* src, std::size_t n) noexcept;

// ---- CUDA graphs ---------------------------------------------------------------------------
/// A captured sequence of launches (a cudaGraph_t), opaque here.
using GraphBody = void*;
/// An instantiated graph with its copy-in and copy-out nodes (kernels/graph.cu), opaque here.
using GraphExec = void*;
/// One device-to-device copy of a graph launch: `bytes` from src to dst (both on the device).
struct GraphCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
};
/// Starts capturing: until capture_end, every launch this thread makes on `device` (what stream()
/// returns to it) is recorded on a private stream instead of running; other threads are not
/// affected. A wait for the device in between fails (and spoils the capture).
Status capture_begin(int device) noexcept;
/// Ends this thread's capture on `device`: *body is what it recorded (null on failure, the status
/// then says why), *armed whether a recorded launch can write the device's fault record.
Status capture_end(int device, GraphBody* body, bool* armed) noexcept;
/// Frees a body that was not instantiated.
void graph_body_destroy(GraphBody body) noexcept;
/// Records, in this thread's capture on `device`, kernels that make the copies c[0..n): which = 0
/// for a graph's copies in (recorded first: this starts the capture's list anew, even with n = 0),
/// 1 for its copies out. graph_instantiate finds them; graph_launch re-points them.
Status capture_copies(int device, int which, const GraphCopy* c, int n) noexcept;
/// The executable graph of `body` (taken: freed with the graph, or here on failure), whose capture
/// recorded the copies `ins` (n_in) and `outs` (n_out) with capture_copies on this thread: their
/// pointers are replaced at every launch.
Status graph_instantiate(int device, GraphBody body, const GraphCopy* ins, int n_in, const GraphCopy* outs, int n_out,
                         GraphExec* out) noexcept;
/// Launches g on its device's stream with these copies (as many, and of the bytes, given to
/// graph_instantiate); arm: the body can write the fault record (the next wait reads it).
Status graph_launch(GraphExec g, const GraphCopy* ins, int n_in, const GraphCopy* outs, int n_out, bool arm) noexcept;
/// Frees g (a launch still running finishes first).
void graph_destroy(GraphExec g) noexcept;

// Control flow inside a capture: conditional graph nodes (CUDA 12.4 and later). A node is added
// after what the capture recorded so far; its bodies are then recorded one at a time between
// capture_body_begin and capture_body_end, on a stream of their own that this thread's launches on
// the device (what stream() returns) go to meanwhile. Bodies nest: a body may add nodes of its own.
/// A conditional node being recorded (its handle and body graphs), opaque here.
using CondNode = void*;
/// Adds an if/else node: body 0 runs when the scalar of `dt` at `pred` (device memory) is non-zero
/// when the node is reached, body 1 otherwise.
Status capture_if(int device, const void* pred, DT dt, CondNode* out) noexcept;
/// Adds a while node: its body runs while the condition holds, first taken from the scalar at
/// `pred`, then from capture_while_next's; `count` (an i64 in device memory, or null) is set to 0
/// here and counts the body's runs.
Status capture_while(int device, const void* pred, DT dt, std::int64_t* count, CondNode* out) noexcept;
/// Records, at the end of a while node's body, the next test of its condition (and a count).
Status capture_while_next(CondNode node, const void* pred, DT dt, std::int64_t* count) noexcept;
/// This thread's launches on the node's device are recorded into its body `body` until
/// capture_body_end.
Status capture_body_begin(CondNode node, int body) noexcept;
/// Ends the body being recorded: launches go back to the enclosing capture.
Status capture_body_end(CondNode node) noexcept;
/// Frees node's record (the node stays in its graph), ending a body capture left open first.
void capture_cond_free(CondNode node) noexcept;

// ---- kernels -------------------------------------------------------------------------------
/// y = rule(x), elementwise; y is bool for LogicalNot, else of x's dtype.
Status unary(UnaryRule r, DT dt, const void* x, void* y, const Geometry& g, Stream s) noexcept;
/// y = rule(a, b) with broadcasting (strides 0, 1 of g); y is bool for comparisons and logical ops.
Status binary(BinaryRule r, DT dt, const void* a, const void* b, void* y, const Geometry& g, Stream s) noexcept;
/// y = c ? a : b with broadcasting (strides 0, 1, 2 of g); c is bool, a, b and y of dt.
Status where(DT dt, const bool* c, const void* a, const void* b, void* y, const Geometry& g, Stream s) noexcept;
/// Copies elements (of itemsize 1, 4 or 8 bytes) of a strided view of x into one of y: index i of
/// g's shape reads x at strides[0] and writes y at strides[1] (the layout ops' one kernel).
Status strided_copy(int itemsize, const void* x, void* y, const Geometry& g, Stream s) noexcept;
/// One input of a concat: `rows` rows of `row` elements, one after another at x, row r written at
/// y + r * pitch (elements).
struct ConcatPiece {
  const void* x;
  void* y;
  std::int64_t rows, row, pitch;
};
/// Pieces one launch copies (they travel as the kernel's parameter).
inline constexpr int max_concat_pieces = 32;
/// Copies the n pieces of a concat (elements of itemsize 1, 4 or 8 bytes): one launch per
/// max_concat_pieces of them.
Status concat(int itemsize, const ConcatPiece* p, int n, Stream s) noexcept;
/// y [n, depth] of dt: row k is 1 at column ix[k] (i32 or i64) when it is in [0, depth), else all 0.
Status one_hot(DT index_dt, DT dt, const void* ix, void* y, std::int64_t n, std::int64_t depth, Stream s) noexcept;
/// y = x converted (rules::Cast), n contiguous elements.
Status cast(DT from, DT to, const void* x, void* y, std::int64_t n, Stream s) noexcept;
/// Every element of y = value converted to dt.
Status fill(DT dt, double value, void* y, std::int64_t n, Stream s) noexcept;
/// y = reduction of x (sum of bool gives i64, else y has x's dtype).
/// `scratch`: reduce_scratch_bytes(g) bytes on the device (may be null when that is 0).
Status reduce(ReduceRule r, DT dt, const void* x, void* y, const ReduceGeometry& g, void* scratch, Stream s) noexcept;
/// The scans of one running value (ops/scan_steps.hpp's Rule, numbered alike).
enum class ScanRule : int { sum = 0, prod = 1, logsumexp = 2, max = 3, min = 4 };
/// y = the running values of x (i32, i64, f32 or f64; logsumexp: f32 or f64) as [outer, n, inner]
/// along n by rule r: inclusive, or exclusive (the identity first); forward, or from the end
/// (reverse). Integer sums and products wrap.
Status scan(ScanRule r, DT dt, const void* x, void* y, std::int64_t outer, std::int64_t n, std::int64_t inner,
            bool exclusive, bool reverse, Stream s) noexcept;
/// y = h of h[k] = a[k] h[k-1] + b[k] (f32 or f64; a, b, y as [outer, n, inner] along n), h = b at
/// each line's first element; exclusive: the h before (0 first); reverse: from the end.
Status linear_scan(DT dt, const void* a, const void* b, void* y, std::int64_t outer, std::int64_t n,
                   std::int64_t inner, bool exclusive, bool reverse, Stream s) noexcept;
/// idx (i64) = the position along n where each running maximum (is_max) or minimum of x (i32,
/// i64, f32 or f64, as [outer, n, inner]) was first reached in scan order; a NaN beats every number
/// and the first NaN's index stays.
Status cum_arg(bool is_max, DT dt, const void* x, std::int64_t* idx, std::int64_t outer, std::int64_t n,
               std::int64_t inner, bool reverse, Stream s) noexcept;
/// Bytes of scratch top_k needs for `lines` lines of n elements of dt (the lines' keys and
/// indices, twice, their offsets, and the sort's own storage), in *bytes.
Status top_k_scratch_bytes(DT dt, std::int64_t lines, std::int64_t n, std::int64_t* bytes) noexcept;
/// idx (i64, [outer, k, inner]) = the indices of the k largest (or smallest) elements of each line
/// of x ([outer, n, inner] along n; i32, i64, f32 or f64), in order: a NaN above every number, -0
/// equal to +0, equal keys in index order (a stable sort). `scratch`: top_k_scratch_bytes bytes.
Status top_k(DT dt, const void* x, std::int64_t* idx, std::int64_t outer, std::int64_t n, std::int64_t inner,
             std::int64_t k, bool largest, void* scratch, std::int64_t scratch_bytes, Stream s) noexcept;
/// The first bad index a kernel found on a device since the last check (tag 0: none). Kernels that
/// can find one (gather, scatter_add) take the device's record and a nonzero tag naming the
/// launch; the host reads the record when it waits for the device anyway (synchronize, copy_d2h),
/// so checking costs no extra wait.
struct Fault {
  std::int32_t tag = 0;
  std::int32_t unused = 0;
  std::int64_t value = 0;  ///< the index as given
  std::int64_t bound = 0;  ///< the extent of its axis
};
/// Returned by synchronize and copy_d2h (after they did their work) when a kernel recorded a
/// fault since the last check; take_fault gives it. Not a cudaError_t value.
inline constexpr Status device_fault = 7001;
/// The device's fault record in device memory (made on first use), armed for the next check.
Status fault_record(int device, Fault** out) noexcept;
/// The fault the last check found on `device` (tag 0: none), cleared.
Status take_fault(int device, Fault* out) noexcept;
/// y = x (n elements of dt, i32 or i64) after checking lo <= x < hi: an element outside is recorded
/// in `fault` with `tag` (its value, and its index as the record's bound) and copied all the same.
Status check_range(DT dt, const void* x, void* y, std::int64_t n, std::int64_t lo, std::int64_t hi, Fault* fault,
                   std::int32_t tag, Stream s) noexcept;
/// y [outer, N, inner] = x [outer, E, inner] picked along the middle axis by ix [N] (i32 or i64,
/// negative counts from the end), elements of itemsize 1, 4 or 8 bytes; an index out of range
/// gives 0 and is recorded in `fault` (the device's record) with `tag`.
Status gather(int itemsize, DT index_dt, const void* x, const void* ix, void* y, std::int64_t outer, std::int64_t E,
              std::int64_t inner, std::int64_t N, Fault* fault, std::int32_t tag, Stream s) noexcept;
/// y = x [outer, E, inner] plus updates [outer, N, inner] added at ix [N] along the middle axis,
/// duplicates accumulating in index order (deterministic); an index out of range is dropped and
/// recorded as gather's.
Status scatter_add(DT dt, DT index_dt, const void* x, const void* ix, const void* updates, void* y, std::int64_t outer,
                   std::int64_t E, std::int64_t inner, std::int64_t N, Fault* fault, std::int32_t tag, Stream s) noexcept;
/// y [outer, M, inner] = x [outer, E, inner] picked along the middle axis by ix (i32 or i64, of y's
/// shape: an index per element, negative counting from the end), elements of itemsize 1, 4 or 8
/// bytes; an index out of range gives 0 and is recorded in `fault` with `tag`.
Status take_along_axis(int itemsize, DT index_dt, const void* x, const void* ix, void* y, std::int64_t outer,
                       std::int64_t E, std::int64_t inner, std::int64_t M, Fault* fault, std::int32_t tag,
                       Stream s) noexcept;
/// y = x [outer, E, inner] plus updates [outer, M, inner] added at ix (of the updates' shape) along
/// the middle axis, one thread a column adding in index order (deterministic); an index out of
/// range is dropped and recorded as take_along_axis's.
Status add_along_axis(DT dt, DT index_dt, const void* x, const void* ix, const void* updates, void* y,
                      std::int64_t outer, std::int64_t E, std::int64_t inner, std::int64_t M, Fault* fault,
                      std::int32_t tag, Stream s) noexcept;
/// softmax_cross_entropy over logits [N, C] (f32/f64) and labels [N] (i32/i64): y (a scalar of dt) =
/// the mean over rows of log(sum(exp(z))) - z[label], z = the row minus its shift (its max, 0 when
/// not finite), as ops::SoftmaxCrossEntropy; a warp per row, the rows' values summed in double in a
/// fixed order. One launch when N * C <= xent_one_block; else `scratch` (N doubles) takes the rows'
/// values and a second launch sums them. A label outside [0, C) is recorded in `fault` with `tag`.
inline constexpr std::int64_t xent_one_block = std::int64_t{1} << 16;
Status softmax_cross_entropy(DT dt, DT label_dt, const void* x, const void* labels, void* y, std::int64_t N,
                             std::int64_t C, double* scratch, Fault* fault, std::int32_t tag, Stream s) noexcept;
/// dx [N, C] = (softmax(x) - one_hot(labels)) * g / N, g a scalar of dt on the device, as
/// ops::SoftmaxCrossEntropyGrad; a label outside is recorded as softmax_cross_entropy's.
Status softmax_cross_entropy_grad(DT dt, DT label_dt, const void* g, const void* x, const void* labels, void* dx,
                                  std::int64_t N, std::int64_t C, Fault* fault, std::int32_t tag, Stream s) noexcept;
/// Both at once (a traced step's loss and its gradient, merged by the plan): y as
/// softmax_cross_entropy's and dx as softmax_cross_entropy_grad's with g, the same numbers, from
/// one pass over the logits: one launch (two past xent_one_block, `scratch` as there) instead of
/// two (three). A bad label is recorded once.
Status softmax_cross_entropy_both(DT dt, DT label_dt, const void* g, const void* x, const void* labels, void* y, void* dx,
                                  std::int64_t N, std::int64_t C, double* scratch, Fault* fault, std::int32_t tag,
                                  Stream s) noexcept;
/// cols [N, C*kh*kw, Ho*Wo] = the windows of x [N, C, H, W] (zero padding), as ops::Im2Col.
Status im2col(DT dt, const void* x, void* cols, const ConvGeometry& g, Stream s) noexcept;
/// x [N, C, H, W] = the columns summed back onto the pixels they read (overwrites x), as ops::Col2Im;
/// one thread per pixel, the windows added in the CPU's order.
Status col2im(DT dt, const void* cols, void* x, const ConvGeometry& g, Stream s) noexcept;
/// y [N, C, Ho, Wo] = the max (NaN wins) or mean of each window of x (no padding), as the CPU pools.
Status pool2d(bool is_max, DT dt, const void* x, void* y, const ConvGeometry& g, Stream s) noexcept;
/// dx [N, C, H, W] = g [N, C, Ho, Wo] summed at each window's argmax in x (the first largest, or the
/// first NaN, in row-major order), as ops::MaxPool2dGrad; one thread per pixel, no atomics.
Status max_pool2d_grad(DT dt, const void* g, const void* x, void* dx, const ConvGeometry& geo, Stream s) noexcept;
/// Which product of a convolution cudnn_conv computes.
enum class ConvPass : int {
  forward,     ///< y [N, O, Ho, Wo] = conv2d(a = x [N, C, H, W], b = w [O, C, kh, kw])
  grad_input,  ///< dx [N, C, H, W] from a = dy [N, O, Ho, Wo] and b = w
  grad_filter  ///< dw [O, C, kh, kw] from a = x and b = dy
};
/// The version of the cuDNN library the kernels loaded (91900 for 9.19.0), loading it on the first
/// call (dlopen: $STAGECRAFT_CUDNN, else libcudnn.so.<major> from the loader's path or the
/// directory the build found it in); 0 when there is none, and `why` (why_size bytes, may be
/// null) says why. Needs no GPU.
int cudnn_version(char* why, std::size_t why_size) noexcept;
/// One pass of conv2d over geometry g with O output channels through cuDNN (f32 or f64, NCHW,
/// full-precision and deterministic algorithms only). not_supported, with nothing queued, when
/// cuDNN is not loaded or takes no such convolution (the caller runs the im2col kernels instead).
Status cudnn_conv(ConvPass pass, DT dt, const void* a, const void* b, void* out, const ConvGeometry& g, std::int64_t O,
                  int device, Stream s) noexcept;
/// The product of GemmArgs (cuBLAS for f32 and f64, a plain kernel for integers). cuBLAS counts
/// M, N and K in int: larger ones are the caller's error to raise (invalid value here).
Status gemm(DT dt, const void* a, const void* b, void* c, const GemmArgs& g, int device, Stream s) noexcept;
/// c = relu?(op(a) op(b) + bias) in one cuBLASLt call (its bias or ReLU-bias epilogue): f32, one
/// matrix (batch 1, no offsets), K > 0, bias of N elements added to every row of c. Anything else,
/// or no cuBLASLt algorithm for the shapes: not_supported, and nothing was queued.
Status gemm_bias(DT dt, const void* a, const void* b, const void* bias, void* c, const GemmArgs& g, bool relu, int device,
                 Stream s) noexcept;
/// c = op(a) b and bgrad[n] = the sum of b's column n (b read untransposed, K x N: a dense layer's
/// bias gradient beside its weight gradient, both from the output's gradient b) in one cuBLASLt
/// call (its BGRADA epilogue): f32, one matrix, K > 0. Anything else, or no cuBLASLt algorithm:
/// not_supported, and nothing was queued.
Status gemm_bgrad(DT dt, const void* a, const void* b, void* c, void* bgrad, const GemmArgs& g, int device,
                  Stream s) noexcept;
/// Inputs one add_n launch sums (their addresses travel as the launch's parameter).
inline constexpr int add_n_max_inputs = 32;
/// y = ((x[0] + x[1]) + x[2]) + ... elementwise, each addition the add rule's: n (1 to
/// add_n_max_inputs) inputs of numel elements of dt (not bool), contiguous; y may be x[0].
Status add_n(DT dt, const void* const* x, int n, void* y, std::int64_t numel, Stream s) noexcept;
/// One variable of a multi-tensor optimizer update: its inputs, its new buffers (inputs unchanged)
/// and its n elements. Adam: in {g, m, v, w}, out {m1, v1, w1}. SGD: in {g, w, vel}, out {w1,
/// vel1}; vel null without momentum (vel1 unused).
struct UpdateTensor {
  const void* in[4] = {};
  void* out[3] = {};
  std::int64_t n = 0;
};
/// Variables one update launch takes (its table travels in the launch's 4 KiB of parameters);
/// the caller splits a longer list.
inline constexpr int update_max_tensors = 48;
/// Adam's fused update of count (<= update_max_tensors) variables of dt (f32/f64) in one launch,
/// as optim/fused.hpp's CPU loop, op by op: m1 = m + (g - m) a1; v1 = v + (g g - v) a2;
/// w1 = w - (m1 lr) / (sqrt(v1) + eps). lr: the rate as a device scalar of dt, or null for lr_host.
/// With `decayed` (AdamW), w is first w - w d (decoupled weight decay), d as lr: the device scalar
/// decay, or decay_host when it is null.
Status adam_update(DT dt, const UpdateTensor* t, int count, const void* lr, double lr_host, double a1, double a2,
                   double eps, bool decayed, const void* decay, double decay_host, Stream s) noexcept;
/// SGD's fused update of count variables (UpdateTensor's SGD order): step = g lr; w1 = w - step,
/// or with a velocity vel1 = vel momentum - step and w1 = w + vel1 (nesterov: w + (vel1 momentum -
/// step)). lr as adam_update's.
Status sgd_update(DT dt, const UpdateTensor* t, int count, const void* lr, double lr_host, double momentum,
                  bool nesterov, Stream s) noexcept;
/// n normal (uniform when !normal) samples of dt (f32/f64) from the Philox stream of the device
/// state {key, offset} (i64 [2]), the same numbers as the CPU op: p0, p1 are mean, stddev (lo, hi).
Status philox(bool normal, DT dt, const std::int64_t* state, double p0, double p1, void* y, std::int64_t n,
              Stream s) noexcept;


// ---- eager batches ---------------------------------------------------------------------------
/// One small op queued by batch_enqueue: y[i] = rule(a[i]) (unary), rule(a[i], b[i]) (binary; an
/// operand of one element is read at 0 by every i: its `one` flag), a[i] converted from dt to
/// out_dt (cast), or `value` converted to dt (fill), for n contiguous elements; or (reduce) the n
/// results of a sum, max or min of a viewed as [n / inner, red, inner] over its middle axis, as
/// abi::reduce gives them (a bool sum is i64, a bool max/min any/all). Three kinds take a
/// BatchGeometry (batch_enqueue's `geo`): `broadcast`, the binary rule with a and b read
/// through its strides over a contiguous y of its shape; `copy`, y at strides[1] = a at
/// strides[0] (elements of dt, bits unchanged); `gemm`, y [M, N] (contiguous) = A B over K, shape
/// {M, N, K}, A's element (m, k) at m * strides[0][0] + k * strides[0][1] (a transposed operand
/// is only other strides), B's (k, n) at k * strides[1][0] + n * strides[1][1], integer sums
/// wrapping; n = M * N. `select` (no geometry): y[i] = c[i] ? a[i] : b[i] (rules::Where) for a, b
/// and y of dt and c bool, each operand contiguous or of one element (its `one` flag; c's is
/// `rule`, 1 or 0, which a select has no other use for).
struct BatchOp {
  enum Kind : std::int8_t { unary, binary, cast, fill, reduce, broadcast, copy, gemm, select };
  Kind kind = unary;
  std::int8_t rule = 0;  ///< a UnaryRule, BinaryRule or ReduceRule (sum, max, min); a select's c_one
  bool a_one = false, b_one = false;
  DT dt = DT::f32;      ///< the inputs' dtype (a fill's output)
  DT out_dt = DT::f32;  ///< a cast's output dtype
  std::int32_t n = 0;
  std::int32_t red = 0, inner = 0;  ///< a reduction's reduced and trailing extents
  const void* a = nullptr;
  const void* b = nullptr;
  void* y = nullptr;
  union {
    double value = 0;  ///< a fill's value
    const bool* c;     ///< a select's condition
  };
};
static_assert(sizeof(BatchOp) == 56, "a batch of 64 ops travels in a launch's 4 KiB of parameters");
/// Axes a BatchGeometry holds (more are merged where they can be: the caller's work).
inline constexpr int batch_max_rank = 4;
/// Where a broadcast, copy or gemm op reads and writes (BatchOp): extents and two operands'
/// strides in elements, every offset below 2^31. It travels in the queue's next slot.
struct BatchGeometry {
  std::int32_t rank = 0;
  std::int32_t shape[batch_max_rank] = {};
  std::int32_t strides[2][batch_max_rank] = {};
  std::int32_t unused = 0;
};
static_assert(sizeof(BatchGeometry) == sizeof(BatchOp), "a geometry takes one slot of a batch");
/// A slot of a batch: an op, or the geometry of the op before it.
union BatchSlot {
  BatchOp op;
  BatchGeometry geo;
  constexpr BatchSlot() noexcept : geo() {}
};
/// Slots one batch launch holds (its ops travel as its parameter, in order, one block of threads):
/// batch_max_ops ops, or fewer with geometries.
inline constexpr int batch_max_ops = 64;
/// Ops with more elements than this (a reduction: more input elements) launch their own kernel.
inline constexpr std::int64_t batch_max_elements = 4096;
/// A gemm op's limits: at most this many outputs (M N) and multiply-adds (M N K); one block does
/// them all, so a larger product is faster as cuBLAS's own launch.
inline constexpr std::int64_t batch_max_gemm_outputs = 16384;
inline constexpr std::int64_t batch_max_gemm_work = std::int64_t{1} << 16;
/// Queues op (its geometry `geo` for the kinds that take one, else null) on `device` (its
/// pointers on that device) instead of launching it: the queued ops
/// are launched together, as one kernel that runs them one after another, when batch_max_ops
/// slots are full, at batch_flush, and before anything else is queued on the device's stream (a
/// kernel, a copy, a free, a wait, a graph launch: every other call of this interface that uses
/// the device's stream launches them first), so the stream's order is kept. not_supported, with
/// nothing queued, when this thread captures a graph on the device or the kernels take no such op
/// (the caller launches it itself).
Status batch_enqueue(int device, const BatchOp& op, const BatchGeometry* geo = nullptr) noexcept;
/// Launches the ops queued on `device`, if any.
Status batch_flush(int device) noexcept;
/// What batch_enqueue did since the process started (all devices).
struct BatchStats {
  std::int64_t ops = 0;      ///< ops queued
  std::int64_t batches = 0;  ///< launches that ran them
};
BatchStats batch_stats() noexcept;

// ---- kernels compiled at run time (NVRTC) ----------------------------------------------------
/// A kernel compiled from source at run time, opaque (a cudaKernel_t).
using RtcKernel = void*;
/// What rtc_kernel did since the process started (for tests and benchmarks).
struct RtcStats {
  std::int64_t compiled = 0;     ///< sources compiled by NVRTC
  std::int64_t memory_hits = 0;  ///< found compiled in this process
  std::int64_t disk_hits = 0;    ///< loaded from the on-disk cache
};
/// The status rtc_kernel and rtc_check return when NVRTC rejects the source (its log says why).
inline constexpr Status rtc_compile_error = 300;  // cudaErrorInvalidSource
/// The kernel `name` (an extern "C" __global__ function) of `source`, compiled for `device`'s GPU
/// with the headers the library embeds ("stagecraft/ops/rules.hpp", the elementwise rules); the
/// kernels of one source share one compile. Cached by the whole source in memory and, unless `cache_dir` is null or empty, in that directory (one
/// file per source and GPU architecture, written atomically; a corrupt or stale file is recompiled).
/// On a compile error, `log` (log_size bytes) holds NVRTC's message.
Status rtc_kernel(int device, const char* source, const char* name, const char* cache_dir, RtcKernel* out, char* log,
                  std::size_t log_size) noexcept;
/// Compiles `source` for GPU architecture `arch` (90 = sm_90) without loading it: needs no GPU.
/// *cubin_bytes is the size of the code made.
Status rtc_check(const char* source, int arch, std::size_t* cubin_bytes, char* log, std::size_t log_size) noexcept;
/// Launches k over n elements (a grid-stride loop: blocks of 256 threads) with its parameters
/// args (a pointer to each, in order).
Status rtc_launch(RtcKernel k, void** args, std::int64_t n, Stream s) noexcept;
/// The counters of rtc_kernel.
RtcStats rtc_stats() noexcept;
/// Forgets the kernels compiled in this process (they stay loaded): the next rtc_kernel of a
/// source reads the disk cache or compiles again (for tests of the disk cache).
void rtc_forget() noexcept;

}  // namespace stagecraft::cuda::abi
