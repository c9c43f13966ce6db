"""The round loop and what it keeps on disk: sampling, client states, run
directories, checkpoints, metrics and the `Task` protocol it trains on."""
