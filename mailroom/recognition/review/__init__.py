"""Review: documents that need a person, and what a person does with them."""
