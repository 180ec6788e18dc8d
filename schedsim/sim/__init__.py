"""The simulator: cost, link and comm models, compile, engine, deadlock diagnosis."""
