"""What the experiment binaries share: start-up and refusals (`common`), the
trainer's flags (`flags`), the backend flags (`runtime_flags`), and helpers of
single binaries that others reuse."""
