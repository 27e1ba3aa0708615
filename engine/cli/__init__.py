"""The command line: commands, the demo and its shipped data, evaluation, ranker training."""
