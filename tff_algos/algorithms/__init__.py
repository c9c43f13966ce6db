"""The algorithms: one module per algorithm, family helpers beside them."""
