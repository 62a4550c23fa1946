"""The recognition contract: message models, the AsyncAPI document, the conformance checker and what counts as a violation."""
