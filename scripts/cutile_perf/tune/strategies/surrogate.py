"""Model-based: a Gaussian-process model of log run time picks each batch by expected improvement.

Why a model and not successive halving: a config's cost is its compile (seconds of tileiras on
sm_90), not its timing, and successive halving saves on timing only, since it times every config
at a low budget first, so it would compile the whole space. A model spends compiles only where it
expects a faster config. The landscape suits one: run time changes smoothly with log2 of each
tile size (within the legal space; legality pruning removes the spill cliffs first, see
``tune.legality``).

Round 1 evaluates the fixed config (``space[0]``) plus a space-filling design (greedy maximin
distance). Every later round refits the model (RBF kernel over log2 of numeric fields and one-hot
of the others; one length scale per feature by marginal likelihood; log time standardised) and evaluates a batch
of ``batch`` configs chosen one by one by expected improvement, each pick added to the model at
its predicted mean before the next (the "kriging believer"), so a batch spreads out and compiles
in parallel. It stops at ``budget`` evaluations or when no config is expected to improve the
best by more than ``min_gain`` (off by default: on the two-basin test landscape, stopping at an
expected gain of 0.2 % found the best in 3 of 20 seeds instead of 20). A failed config counts as
slower than the slowest seen.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence

from cutile_perf.tune.config import Config, Trial

OPTIONS = {
    "budget": ("max configs to evaluate (0: a quarter of the space)", 0),
    "initial": ("configs in the space-filling first round, fixed config included (0: a third of the budget)", 0),
    "batch": ("configs per model-guided round (compiled in parallel)", 8),
    "min_gain": ("stop early when no config is expected to gain this fraction (0: never stop early)", 0.0),
    "seed": ("random seed (tie-breaks of the first round)", 0),
}
PARALLEL_COMPILE = True

LENGTH_SCALES = (0.15, 0.25, 0.4, 0.7, 1.2, 3.0)
NOISE = 1e-3  # on standardised log time: measurements repeat within about 1 %


def features(space: Sequence[Config]):
    """One row per config: log2 of each positive numeric field scaled to [0, 1] over the space,
    one-hot (scaled by 1/sqrt 2, so two differing values are distance 1 apart) for the rest."""
    import numpy as np

    names = sorted({k for c in space for k in c})
    columns = []
    for name in names:
        values = [c.get(name) for c in space]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)
        if numeric:
            logs = [math.log2(v) for v in values]
            lo, hi = min(logs), max(logs)
            if hi > lo:
                columns.append([(x - lo) / (hi - lo) for x in logs])
            continue
        distinct = sorted({repr(v) for v in values})
        if len(distinct) > 1:
            for d in distinct:
                columns.append([math.sqrt(0.5) if repr(v) == d else 0.0 for v in values])
    if not columns:
        return np.zeros((len(space), 1))
    return np.array(columns, dtype=float).T


def _rbf(a, b, scales):
    """RBF kernel with one length scale per feature column (``scales`` broadcast over columns)."""
    diff = (a[:, None, :] - b[None, :, :]) / scales
    import numpy as np

    return np.exp(-0.5 * (diff * diff).sum(-1))


class GP:
    """Zero-mean GP on standardised targets. One length scale per feature, each picked from
    ``LENGTH_SCALES`` by coordinate ascent on the marginal likelihood: a field that barely
    matters (often ``occupancy``) gets a long scale and stops dominating distances."""

    def __init__(self, x, y, scales=None):
        """``scales``: reuse these length scales instead of fitting them (the believer's refits)."""
        import numpy as np

        self.x = x
        self.mu = float(np.mean(y))
        self.sd = float(np.std(y)) or 1.0
        self.z = (np.asarray(y) - self.mu) / self.sd
        if scales is not None:
            best = self._fit(scales) or self._fit(scales, noise=1e-2)
            _, self.scales, self.chol, self.alpha = best
            return
        scales = np.full(x.shape[1], LENGTH_SCALES[2])
        best = self._fit(scales)
        for _ in range(2):  # two sweeps settle it on these grids
            for d in range(x.shape[1]):
                for value in LENGTH_SCALES:
                    if value == scales[d]:
                        continue
                    trial = scales.copy()
                    trial[d] = value
                    fit = self._fit(trial)
                    if fit is not None and (best is None or fit[0] > best[0]):
                        best, scales = fit, trial
        if best is None:  # numerically singular everywhere: widest scales, more noise
            best = self._fit(np.full(x.shape[1], LENGTH_SCALES[-1]), noise=1e-2)
        _, self.scales, self.chol, self.alpha = best

    def _fit(self, scales, noise=NOISE):
        import numpy as np

        k = _rbf(self.x, self.x, scales) + noise * np.eye(len(self.x))
        try:
            chol = np.linalg.cholesky(k)
        except np.linalg.LinAlgError:
            return None
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, self.z))
        loglik = -0.5 * float(self.z @ alpha) - float(np.log(np.diag(chol)).sum())
        return loglik, scales, chol, alpha

    def predict(self, xs):
        """Mean and standard deviation of log time at ``xs``."""
        import numpy as np

        ks = _rbf(xs, self.x, self.scales)
        mean = ks @ self.alpha
        v = np.linalg.solve(self.chol, ks.T)
        var = np.clip(1.0 - (v * v).sum(0), 1e-12, None)
        return self.mu + self.sd * mean, self.sd * np.sqrt(var)


def expected_improvement(mean, std, best):
    """EI for minimisation, in log-time units."""
    import numpy as np

    z = (best - mean) / std
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (best - mean) * cdf + std * pdf


def maximin(x, chosen: list[int], count: int, rng: random.Random) -> list[int]:
    """Add ``count`` indices, each the farthest from everything chosen so far (ties at random)."""
    import numpy as np

    chosen = list(chosen)
    dist = np.full(len(x), np.inf)
    for i in chosen:
        dist = np.minimum(dist, ((x - x[i]) ** 2).sum(1))
    picks = []
    for _ in range(count):
        far = float(dist.max())
        if far <= 0:
            break
        ties = [int(i) for i in np.flatnonzero(dist >= far - 1e-12)]
        i = rng.choice(ties)
        picks.append(i)
        dist = np.minimum(dist, ((x - x[i]) ** 2).sum(1))
    return picks


def _targets(trials: Sequence[Trial]) -> list[float]:
    finite = [math.log(t.score) for t in trials if t.ok and t.score > 0]
    worst = max(finite) + math.log(2.0) if finite else 0.0  # a failure: slower than anything that ran
    return [math.log(t.score) if t.ok and t.score > 0 else worst for t in trials]


def search(space, evaluate, options):
    import numpy as np

    space = list(space)
    budget = int(options["budget"]) or math.ceil(len(space) / 4)
    budget = max(1, min(budget, len(space)))
    if budget >= len(space):
        return evaluate(space)
    batch = max(1, int(options["batch"]))
    initial = int(options["initial"]) or max(batch, budget // 3)
    initial = max(1, min(initial, budget))
    rng = random.Random(options["seed"])
    x = features(space)
    first = [0] + maximin(x, [0], initial - 1, rng)
    trials: dict[int, Trial] = {}
    index = {c: i for i, c in enumerate(space)}
    for t in evaluate([space[i] for i in first]):
        trials[index[t.config]] = t
    while len(trials) < budget:
        done = sorted(trials)
        y = _targets([trials[i] for i in done])
        best = min(y)
        picks: list[int] = []
        xs, ys = list(done), list(y)
        scales = None
        for _ in range(min(batch, budget - len(trials))):
            todo = [i for i in range(len(space)) if i not in trials and i not in picks]
            if not todo:
                break
            model = GP(x[xs], np.array(ys), scales)
            scales = model.scales  # fitted on measurements only; the believed points reuse them
            mean, std = model.predict(x[todo])
            ei = expected_improvement(mean, std, best)
            j = int(np.argmax(ei))
            if not picks and float(ei[j]) < math.log1p(float(options["min_gain"])):
                break  # nothing is expected to beat the best by more than min_gain
            picks.append(todo[j])
            xs.append(todo[j])
            ys.append(float(mean[j]))  # believe the model's mean until it is measured
        if not picks:
            break
        for t in evaluate([space[i] for i in picks]):
            trials[index[t.config]] = t
    return list(trials.values())

