"""The context window: history, value, tiers, page-in, assembly, and the ContextManager facade over them."""
