"""Flex-DSA HTTP service: FastAPI app, schemas, database models, artifact storage and API-key auth."""
