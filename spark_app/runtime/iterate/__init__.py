"""The iterate (fixed-point) operator: declaration, policy, engine, storage, sink."""
