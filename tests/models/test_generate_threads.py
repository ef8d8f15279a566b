"""`CausalLM.generate` from several threads at once on one loaded model equals the serial results."""

from __future__ import annotations

import threading

import numpy as np

from maxfx.models import load_pretrained
from tests.models._helpers import LLAMA


def test_four_threads_generate_at_once():
    m = load_pretrained(str(LLAMA))  # a fresh model: its first compile happens under the threads
    prompts = [np.array([[1 + t, 2, 3, 4 + t, 5]]) for t in range(4)]
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            results[t] = m.generate(prompts[t], max_new_tokens=7, seed=3, temperature=0.0)
        except BaseException as err:  # collected, so the test fails with the thread's error
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    for t in range(4):
        np.testing.assert_array_equal(results[t], m.generate(prompts[t], max_new_tokens=7))
