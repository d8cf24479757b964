"""The page of ``python -m ortlearn export-web`` trains in a real browser (headless Chromium,
onnxruntime-web's WebAssembly build, and its WebGPU build on Chromium's software Vulkan) and
the model it exports scores the same in Python."""

from __future__ import annotations

import functools
import http.server
import json
import os
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from safetensors.numpy import load_file

from ortlearn import CheckpointState, TrainingSession
from ortlearn.__main__ import export_web
from tests.conftest import CHROMIUM_FLAGS, require

EPOCHS = 3


def _mulberry32_permutation(n: int, seed: int) -> list[int]:
    """The page's shuffle (js/web/app.js ``permutation``): mulberry32 and Fisher-Yates."""
    a = seed & 0xFFFFFFFF

    def imul(x, y):
        return (x * y) & 0xFFFFFFFF

    def random():
        nonlocal a
        a = (a + 0x6D2B79F5) & 0xFFFFFFFF
        t = a
        t = imul(t ^ (t >> 15), t | 1)
        t ^= (t + imul(t ^ (t >> 7), t | 61)) & 0xFFFFFFFF
        return ((t ^ (t >> 14)) & 0xFFFFFFFF) / 4294967296

    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = int(random() * (i + 1))
        order[i], order[j] = order[j], order[i]
    return order


def _python_run(directory, data, epochs, batch_size):
    """The page's steps with ortlearn's TrainingSession: the final parameters."""
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    session = TrainingSession(state, str(directory / "training_model.onnx"),
                              str(directory / "eval_model.onnx"),
                              str(directory / "optimizer_model.onnx"))
    n = len(data["X_train"])
    for epoch in range(1, epochs + 1):
        order = _mulberry32_permutation(n, epoch)
        for start in range(0, n, batch_size):
            rows = order[start:start + batch_size]
            session.lazy_reset_grad()
            session.train_step(data["X_train"][rows], data["y_train"][rows])
            session.optimizer_step()
    values = {name: state.parameters[name].data.copy() for name in state.parameters.keys()}
    session.close()
    return values


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".mjs": "text/javascript", ".wasm": "application/wasm"}

    def log_message(self, *args):
        pass


@pytest.fixture
def served_page(js_dir, tmp_path):
    """The demo's page (digits, an MLP fitted two epochs in Python), served on 127.0.0.1."""
    directory = tmp_path / "page"
    export_web(directory, epochs=EPOCHS, js_dir=js_dir)
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield directory, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        thread.join(10)


#: Chromium's WebGPU on SwiftShader, its software Vulkan (Debian's package ships it): no GPU
#: needed, and WebGPU's code paths run for real
WEBGPU_FLAGS = [f for f in CHROMIUM_FLAGS if f != "--disable-gpu"] + [
    "--enable-unsafe-webgpu", "--enable-unsafe-swiftshader"]


def _swiftshader(chromium: str) -> bool:
    """Whether this Chromium ships SwiftShader's Vulkan (Debian's package: /usr/lib/chromium)."""
    folders = {Path(os.path.realpath(chromium)).parent, Path("/usr/lib/chromium")}
    return any((folder / "libvk_swiftshader.so").is_file() for folder in folders)


@pytest.mark.parametrize("backend, flags", [("wasm", CHROMIUM_FLAGS), ("webgpu", WEBGPU_FLAGS)])
def test_page_trains_in_chromium(served_page, chromium, tmp_path, backend, flags):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the test extra's playwright")
    if backend == "webgpu":
        require(_swiftshader(chromium), "this Chromium ships no SwiftShader Vulkan for WebGPU")
    directory, url = served_page
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=flags)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto(url)
        page.wait_for_function("window.ortlearn && window.ortlearn.done", timeout=240_000)
        run = page.evaluate("""() => ({error: ortlearn.error, backend: ortlearn.backend,
            before: ortlearn.scoreBefore, epochs: ortlearn.epochs, steps: ortlearn.losses.length,
            model: ortlearn.inferenceModel ? Array.from(ortlearn.inferenceModel) : null,
            checkpoint: ortlearn.checkpoint ? Array.from(ortlearn.checkpoint) : null})""")
        # what a person sees: the loss curve, the accuracy per epoch, the download links
        page.screenshot(path=str(tmp_path / "trained_page.png"), full_page=True)
        browser.close()
    assert run["error"] is None, run["error"]
    # --disable-gpu: no WebGPU adapter, onnxruntime-web's WebAssembly build
    assert run["backend"] == backend
    accuracies = [e["score"] for e in run["epochs"]]
    assert len(accuracies) == EPOCHS and accuracies[-1] > run["before"]
    assert accuracies[-1] >= 0.9
    # the exported inference model, run by Python's onnxruntime on the same test rows
    data = load_file(str(directory / "data.safetensors"))
    session = ort.InferenceSession(bytes(run["model"]), providers=["CPUExecutionProvider"])
    scores = session.run(["raw_scores"], {"X": data["X_test"]})[0]
    accuracy = float(np.mean(scores.argmax(axis=1) == data["y_test"]))
    # the same weights; only a near tie between two classes could flip between the builds
    assert abs(accuracy - accuracies[-1]) <= 1 / len(data["y_test"])
    # the page's checkpoint loads in Python and has counted every update
    exported = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    trained = CheckpointState.load_checkpoint(bytes(run["checkpoint"]))
    assert trained.optimizer_step == exported.optimizer_step + run["steps"]
    # the same steps in Python: the browser's kernels give the same weights to float32
    # rounding (summation orders of another build of the matrix products; WebGPU's shaders
    # also round their exp and division otherwise, about 1e-6 of the activations, which
    # Adam's normalised steps of 1e-3 carry into the weights' last digits over 129 steps)
    task = json.loads((directory / "task.json").read_text())
    assert task["webgpu"]  # float32 models only: the optimizer's scalars too
    expected = _python_run(directory, data, EPOCHS, task["batch_size"])
    atol = 1e-6 if backend == "wasm" else 2e-5
    for name, value in expected.items():
        got = trained.parameters[name].data
        np.testing.assert_allclose(got, value, rtol=1e-5, atol=atol, err_msg=name)
