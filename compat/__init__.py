"""Drop-in replacements for the APIs of retired profilers (SageMaker Profiler)."""
