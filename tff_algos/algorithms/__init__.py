"""The algorithms: one package per algorithm (or family), each a `config.py`
that declares its hyperparameters and imports no TensorFlow, and a
`process.py`, its TFF computation; `groups` holds the hyperparameter groups
they share, `registry` finds them by name, `gbo/` holds what the FedGBO
family shares."""
