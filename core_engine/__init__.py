"""batchtop's engine: a real paged-KV continuous batcher. Imports no UI library."""
