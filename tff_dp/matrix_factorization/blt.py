"""Buffered linear Toeplitz (BLT) strategies (Dvijotham et al. 2024, arXiv 2404.16706; McMahan,
Xu & Zhang 2024, arXiv 2408.08868), parameterized as jax_privacy names them: `buf_decay`
theta_i and `output_scale` omega_i, with coefficients

    c_0 = 1,    c_k = sum_i omega_i theta_i^(k-1)    (k >= 1).

As a system with one buffer per pair: s_0 = 0, y_t = x_t + omega . s_t, s_{t+1} = Theta s_t +
x_t 1. Its inverse is the system x_t = y_t - omega . s_t, s_{t+1} = (Theta - 1 omega^T) s_t +
y_t 1, a BLT whose buf_decay are the eigenvalues of M = Theta - 1 omega^T and whose
output_scale are -(omega^T V)_i (V^-1 1)_i (M = V diag(lambda) V^-1): `BLT.inverse`.

The noise of round t is (C^-1 z)_t, computed by `streaming.Stream` with the forward system solved
for x (the recurrence the run's noise feed runs): x_t = z_t - omega . s_t,
s_{t+1} = Theta s_t + x_t 1, all real, one model-sized buffer per pair updated once per round.
The closed-form inverse (whose parameters may be complex) is the analysis's, not the stream's.
"""

import dataclasses
import math

import numpy as np
from scipy import optimize as scipy_optimize

from tff_dp.matrix_factorization import toeplitz


@dataclasses.dataclass(frozen=True)
class BLT:
  """A BLT strategy: `buf_decay` theta and `output_scale` omega (equal lengths)."""
  buf_decay: tuple
  output_scale: tuple

  def __post_init__(self):
    if len(self.buf_decay) != len(self.output_scale):
      raise ValueError('buf_decay and output_scale must have the same length')

  @property
  def num_buffers(self) -> int:
    return len(self.buf_decay)

  def coefs(self, n: int) -> np.ndarray:
    """The first n Toeplitz coefficients of C (real part: a stable real BLT has real ones)."""
    theta = np.asarray(self.buf_decay, dtype=np.complex128)
    omega = np.asarray(self.output_scale, dtype=np.complex128)
    c = np.zeros(n, dtype=np.complex128)
    c[0] = 1.0
    if n > 1 and theta.size:
      powers = theta[None, :] ** np.arange(n - 1)[:, None]
      c[1:] = powers @ omega
    return c.real

  def inverse(self) -> 'BLT':
    """C^-1 as a BLT, in closed form (the module docstring)."""
    theta = np.asarray(self.buf_decay, dtype=np.float64)
    omega = np.asarray(self.output_scale, dtype=np.float64)
    m = np.diag(theta) - np.outer(np.ones_like(theta), omega)
    eigenvalues, v = np.linalg.eig(m)
    scales = -(omega @ v) * np.linalg.solve(v, np.ones_like(theta))
    return BLT(tuple(_real_if_close(eigenvalues)), tuple(_real_if_close(scales)))

  def is_stable(self) -> bool:
    """All decays in (0, 1) and all scales positive: non-negative, decreasing coefficients."""
    theta, omega = np.asarray(self.buf_decay), np.asarray(self.output_scale)
    return bool(np.all(np.isreal(theta)) and np.all((theta > 0) & (theta < 1))
                and np.all(np.isreal(omega)) and np.all(omega > 0))


def _real_if_close(values: np.ndarray) -> np.ndarray:
  return np.real_if_close(values, tol=1e6)


def _blt_from_params(params: np.ndarray) -> BLT:
  """Unconstrained params -> a stable BLT: theta = sigmoid(u) in (0, 1), and omega from a
  softplus scaled so that sum omega <= 1 (c_1 <= c_0: non-increasing coefficients)."""
  d = params.size // 2
  theta = 1.0 / (1.0 + np.exp(-params[:d]))
  raw = np.log1p(np.exp(params[d:]))
  omega = raw / max(1.0, raw.sum() + 1e-12)
  return BLT(tuple(theta), tuple(omega))


def _merged(strategy: BLT, tolerance: float = 1e-4) -> BLT:
  """`strategy` with decays closer than `tolerance` merged into one buffer (their scales
  summed, the decay their scale-weighted mean): twins are what the optimizer returns when a
  fit with fewer buffers stalled at its bound (one scale at 1), and one buffer holds them."""
  merged = []   # [decay, scale] pairs, decays ascending.
  for decay, scale in sorted(zip(strategy.buf_decay, strategy.output_scale)):
    if merged and decay - merged[-1][0] < tolerance:
      total = merged[-1][1] + scale
      merged[-1] = [(merged[-1][0] * merged[-1][1] + decay * scale) / total, total]
    else:
      merged.append([decay, scale])
  return BLT(tuple(d for d, _ in merged), tuple(s for _, s in merged))


# The relative loss a further buffer must buy to be kept (`optimize`).
BUFFER_GAIN = 1e-4


def optimize(n: int, min_separation: int = 0, max_participations: int = 1, *,
             max_buffers: int = 4, error: str = 'mean', seed: int = 0,
             restarts: int = 3) -> tuple[BLT, float]:
  """(a BLT with the fewest buffers whose `toeplitz.loss` is within `BUFFER_GAIN` of the
  smallest found, its loss) for n rounds under the participation schedule, trying
  1..`max_buffers` buffers (jax_privacy's range: a few) with `restarts` random starts each
  (L-BFGS-B on unconstrained parameters). A buffer costs a model-sized array every round, so
  one that buys less than `BUFFER_GAIN` of the loss is left out: without this rule the optimizer
  splits one decay into near-equal twins (0.91190 and 0.91183) for a gain of 2e-7. Raises
  ValueError if no stable BLT was found."""
  if not 1 <= max_buffers <= 8:
    raise ValueError('max_buffers must be in 1..8')
  rng = np.random.default_rng(seed)
  best_per_size: dict[int, tuple[BLT, float]] = {}

  def objective(params):
    strategy = _blt_from_params(params)
    return math.log(toeplitz.loss(strategy.coefs(n), n, min_separation, max_participations,
                                  error))

  for d in range(1, max_buffers + 1):
    for restart in range(restarts):
      # Decays spread from ~0.5 to ~1 - 1/n (the time scales a prefix sum over n rounds
      # needs), jittered after the first start; scales summing to 1/2.
      jitter = 1.0 + (0.3 * rng.random(d) if restart else 0.0)
      theta = np.clip(1.0 - np.logspace(-0.3, -math.log10(max(n, 2)), d) * jitter, 0.01, 0.999)
      start = np.concatenate([np.log(theta / (1.0 - theta)),
                              np.log(np.expm1(np.full(d, 0.5 / d)))])
      result = scipy_optimize.minimize(objective, start, method='L-BFGS-B',
                                       options={'maxiter': 300})
      found = _blt_from_params(result.x)
      for strategy in (found, _merged(found)):
        value = toeplitz.loss(strategy.coefs(n), n, min_separation, max_participations, error)
        size = strategy.num_buffers
        if strategy.is_stable() and value < best_per_size.get(size, (None, math.inf))[1]:
          best_per_size[size] = strategy, value
  if not best_per_size:
    raise ValueError(f'no stable BLT found for n={n}, min_separation={min_separation}, '
                     f'max_participations={max_participations}')
  smallest_loss = min(value for _, value in best_per_size.values())
  return next(best_per_size[d] for d in sorted(best_per_size)
              if best_per_size[d][1] <= smallest_loss * (1.0 + BUFFER_GAIN))
