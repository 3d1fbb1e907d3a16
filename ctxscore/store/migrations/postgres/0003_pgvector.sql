-- ctxscore PostgreSQL store, version 3 (optional): a pgvector copy of each embedding, so vector
-- search runs in the server. Applied only where the extension is available
-- (pg_available_extensions); until then the store scores embeddings per session in numpy, and
-- a later open applies it once the extension has been installed. The store copies the
-- embeddings of rows stored before (ctxscore.store.postgres.PostgresStore._backfill_vectors).
-- requires-extension: vector
CREATE EXTENSION IF NOT EXISTS vector;
ALTER TABLE ctx_messages ADD COLUMN embedding_v vector;
