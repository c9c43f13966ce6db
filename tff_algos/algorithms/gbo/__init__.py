"""What FedGBO, MFL and Mime(X)lite share: optimisers written as update U,
tracking T and inverse I (`optimizers`), and client work with server-held
optimiser statistics (`statistics`)."""
