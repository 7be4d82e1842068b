"""Real-framework trace corpus: generators that drive agent frameworks with scripted models and
capture the OTLP their exporters send, and the ground truth the evaluation checks it against.

The generators run in the framework venv (`make framework-corpus`); the captured corpus under
``sample_traces/frameworks/`` and ``corpus.truth`` / ``corpus.store`` need only the standard library.
"""
