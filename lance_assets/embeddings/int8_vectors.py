"""Document vectors as int8 and the products on them: the quantization (each unit vector scaled
so its largest component is +-127), cosine k-means, and the exact int8 cosine product.

**The product** (:func:`cosines`) is an integer one: ONNX Runtime's ``MatMulInteger`` (int8
dot-product instructions: VNNI on x86, dot products on ARM) on the int8 vectors, exact in int32,
then scaled by the norms in float32: 3.6x float32 BLAS on the same vectors at 47 rows by 5,000,
one core, and as fast per pair on a few rows as on hundreds (``benchmarks.semantic_dup_real
--kernels``; ``semantic_dup`` multiplies each cluster of its store by the few new rows probing
it). Each process checks once that the kernel is exact here (on extreme vectors, against
numpy); where it is not (kernels that saturate 16-bit sums), the same cosines come from float32
BLAS on the vectors (exact too: every partial sum is an integer below 2**24), only slower.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

DIM = 384
KMEANS_ITERATIONS = 25
BLOCK = 8192  # rows per product in the nearest-centroid search


# ---------------------------------------------------------------------------- vectors

def quantize(unit: np.ndarray) -> np.ndarray:
    """Unit vectors as int8, each scaled so its largest component is +-127. A cosine of two such
    vectors (dot / norms) is exact in float32 arithmetic: every partial sum of a dot product is an
    integer below 2**24 (127 * 127 * 384 = 6.2 M), whatever the order a BLAS adds in, so local and
    Ray runs agree to the bit. Rows of zeros stay zeros."""
    unit = np.asarray(unit, np.float32)
    peak = np.abs(unit).max(axis=1, keepdims=True) if len(unit) else np.ones((0, 1), np.float32)
    scaled = unit * (127.0 / np.where(peak == 0, 1, peak))
    return np.clip(np.rint(scaled), -127, 127).astype(np.int8)


def as_unit(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 vectors -> (float32 copies, 1 / norm of each)."""
    x = q.astype(np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    return x, (1.0 / np.where(norms == 0, 1, norms)).astype(np.float32)


def inv_norms(q: np.ndarray) -> np.ndarray:
    """1 / the norm of each int8 vector (float32; 1 for zeros), as ``as_unit`` gives it."""
    return as_unit(q)[1]


# ---------------------------------------------------------------------------- k-means

def nearest(x: np.ndarray, centroids: np.ndarray, probes: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The ``probes`` nearest centroids of each unit row of ``x`` (best first) and the cosine
    with the nearest."""
    n, k = len(x), len(centroids)
    p = min(probes, k)
    out = np.empty((n, p), np.int64)
    best = np.empty(n, np.float32)
    for lo in range(0, n, BLOCK):
        s = x[lo:lo + BLOCK] @ centroids.T
        if p == 1:
            top = np.argmax(s, axis=1)[:, None]
        else:
            top = np.argpartition(-s, p - 1, axis=1)[:, :p]
            order = np.argsort(-np.take_along_axis(s, top, axis=1), axis=1, kind="stable")
            top = np.take_along_axis(top, order, axis=1)
        out[lo:lo + BLOCK] = top
        best[lo:lo + BLOCK] = s[np.arange(len(s)), top[:, 0]]
    return out, best


def spherical_kmeans(x: np.ndarray, k: int, seed: int,
                     iterations: int = KMEANS_ITERATIONS) -> np.ndarray:
    """(k, 384) unit centroids of the unit rows ``x`` (cosine k-means, k-means++ start)."""
    rng = np.random.default_rng(seed)
    n = len(x)
    k = max(1, min(k, n))
    centroids = np.empty((k, x.shape[1]), np.float32)
    centroids[0] = x[rng.integers(n)]
    dist = 1.0 - x @ centroids[0]
    for c in range(1, k):  # k-means++: the next start far from those chosen
        p = np.clip(dist, 0, None) ** 2
        i = rng.choice(n, p=p / p.sum()) if p.sum() > 0 else rng.integers(n)
        centroids[c] = x[i]
        dist = np.minimum(dist, 1.0 - x @ centroids[c])
    labels = None
    for _ in range(iterations):
        new = nearest(x, centroids)[0][:, 0]
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        order = np.argsort(labels, kind="stable")
        present, starts = np.unique(labels[order], return_index=True)
        sums = np.zeros_like(centroids, dtype=np.float64)
        sums[present] = np.add.reduceat(x[order], starts, axis=0)
        norms = np.linalg.norm(sums, axis=1)
        empty = norms == 0
        if empty.any():  # an empty cluster restarts at the rows worst served
            worst = np.argsort(np.einsum("ij,ij->i", x, centroids[labels]))[:int(empty.sum())]
            sums[empty] = x[worst]
            norms[empty] = 1.0
        centroids = (sums / norms[:, None]).astype(np.float32)
    return centroids


@lru_cache(maxsize=1)
def _integer_product():
    """This process's ONNX Runtime session of one ``MatMulInteger`` (uint8 rows with zero point
    128 times int8 columns, int32 out) when it is exact here, else None."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "zero"], ["y"])], "cosines",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, ["m", DIM]),
         helper.make_tensor_value_info("b", TensorProto.INT8, [DIM, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["m", "n"])],
        initializer=[helper.make_tensor("zero", TensorProto.UINT8, [], [128])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1  # Ray runs a task per core; locally, one product at a time
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    # exact here? extreme vectors (a kernel summing pairs into 16 bits saturates on them) and
    # random ones, against numpy's int64 product
    rng = np.random.default_rng(0)
    x = np.concatenate([np.full((2, DIM), 127, np.int8), np.full((2, DIM), -127, np.int8),
                        rng.integers(-127, 128, (28, DIM)).astype(np.int8)])
    x[1, ::2] = -127
    x[3, ::2] = 127
    y = np.ascontiguousarray(x[::-1].T)
    got = session.run(None, {"a": x.view(np.uint8) ^ np.uint8(0x80), "b": y})[0]
    return session if np.array_equal(got, x.astype(np.int64) @ y.astype(np.int64)) else None


def kernel() -> str:
    """The product this process uses (reported with a run's numbers)."""
    return "int8 MatMulInteger" if _integer_product() is not None else "float32 BLAS"


def cosines(x: np.ndarray, xi: np.ndarray, yt: np.ndarray, yi: np.ndarray) -> np.ndarray:
    """(m, n) float32 cosines of int8 rows ``x`` (m, 384) and int8 columns ``yt`` (384, n), given
    1 / their norms: the exact integer dot product, times ``xi``, times ``yi``, in float32. The
    same bits whichever kernel computes the product."""
    session = _integer_product()
    if session is None:
        return float_cosines(x, xi, yt, yi)
    s = session.run(None, {"a": x.view(np.uint8) ^ np.uint8(0x80),
                           "b": np.ascontiguousarray(yt)})[0].astype(np.float32)
    s *= xi[:, None]
    s *= yi[None, :]
    return s


def float_cosines(x: np.ndarray, xi: np.ndarray, yt: np.ndarray, yi: np.ndarray) -> np.ndarray:
    """``cosines`` with float32 BLAS: exact too (integer sums below 2**24), slower."""
    s = x.astype(np.float32) @ yt.astype(np.float32)
    s *= xi[:, None]
    s *= yi[None, :]
    return s


