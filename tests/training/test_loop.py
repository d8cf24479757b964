"""``training.run_epochs``: the one epoch loop of the estimators, ``OrtGradientOptimizer`` and
onnxcustom's optimizer."""

import pytest

from ortlearn.exceptions import ConvergenceError
from ortlearn.training.loop import run_epochs


def _epochs(script):
    """``train_epoch`` following ``script``: a loss, or an exception to raise, per epoch."""
    def train_epoch(number):
        step = script[number - 1]
        if isinstance(step, BaseException):
            raise step
        return step
    return train_epoch


def test_every_epoch_runs_and_its_loss_is_recorded():
    seen, curve = [], []
    done = run_epochs(3, _epochs([3.0, 2.0, 1.0]), curve,
                      after_epoch=lambda n, loss: seen.append((n, loss, len(curve))))
    assert done == 3 and curve == [3.0, 2.0, 1.0]
    assert seen == [(1, 3.0, 1), (2, 2.0, 2), (3, 1.0, 3)]  # after its loss is appended


def test_after_epoch_stops_training():
    curve = []
    assert run_epochs(10, _epochs([3.0, 2.0, 1.0]), curve,
                      after_epoch=lambda n, loss: loss < 2.5) == 2
    assert curve == [3.0, 2.0]


def test_a_divergence_goes_to_its_handler_with_the_epoch_number():
    error, handled, curve = ConvergenceError("diverged"), [], []
    done = run_epochs(5, _epochs([3.0, 2.0, error]), curve,
                      on_diverged=lambda exc, n: handled.append((exc, n)))
    assert done == 2 and curve == [3.0, 2.0] and handled == [(error, 3)]
    with pytest.raises(ConvergenceError, match="diverged"):  # no handler: it goes through
        run_epochs(5, _epochs([error]), [])

    def reraise(exc, n):
        raise ValueError(f"epoch {n}") from exc

    with pytest.raises(ValueError, match="epoch 1"):
        run_epochs(5, _epochs([error]), [], on_diverged=reraise)


def test_ctrl_c_keeps_what_was_reached_or_goes_through():
    curve = []
    with pytest.warns(UserWarning, match="interrupted by user after 2 epochs"):
        assert run_epochs(5, _epochs([3.0, 2.0, KeyboardInterrupt()]), curve) == 2
    assert curve == [3.0, 2.0]
    with pytest.raises(KeyboardInterrupt):
        run_epochs(5, _epochs([KeyboardInterrupt()]), [], interruptible=False)
