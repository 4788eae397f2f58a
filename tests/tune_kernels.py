"""cuTile kernels for the tune tests (importable by spawned compile workers). Not a test module."""
import cuda.tile as ct


@ct.kernel
def matmul_kernel(A, B, C, TM: ct.Constant[int], TN: ct.Constant[int], TK: ct.Constant[int]):
    bid_m = ct.bid(0)
    bid_n = ct.bid(1)
    acc = ct.full((TM, TN), 0.0, dtype=ct.float32)
    for k in range(ct.num_tiles(A, axis=1, shape=(TM, TK))):
        a = ct.load(A, index=(bid_m, k), shape=(TM, TK), padding_mode=ct.PaddingMode.ZERO)
        b = ct.load(B, index=(k, bid_n), shape=(TK, TN), padding_mode=ct.PaddingMode.ZERO)
        acc = ct.mma(a, b, acc)
    ct.store(C, index=(bid_m, bid_n), tile=ct.astype(acc, C.dtype))


@ct.kernel
def broken_kernel(A, B, C, TM: ct.Constant[int], TN: ct.Constant[int], TK: ct.Constant[int]):
    # Tile shapes must be powers of two: 48 fails to compile, which is the point of this kernel.
    t = ct.load(A, index=(0, 0), shape=(48, TK))
    ct.store(C, index=(0, 0), tile=t)


@ct.kernel
def add_one_kernel(X, TILE: ct.Constant[int]):
    # In place: X += 1, one tile per block (the split-buffer GPU test).
    bid = ct.bid(0)
    t = ct.load(X, index=(bid,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(X, index=(bid,), tile=t + 1)
