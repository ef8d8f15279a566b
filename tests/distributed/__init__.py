"""Tests of maxfx on JAX's multi-process runtime: several processes on one host, all on 127.0.0.1."""
