-- ctxscore PostgreSQL store, version 4: a random id of this store (one per schema: each schema is
-- a deployment's store), for the Redis namespace of its hot state when the store's role may not
-- read the server's system identifier (pg_control_system(), revoked from PUBLIC by managed
-- services): the host and port a worker wrote would differ between workers that spell the host
-- differently, the id does not. ctxscore.store.postgres.PostgresStore writes the one row the first
-- time it needs it (INSERT ... ON CONFLICT DO NOTHING, then reads the row: concurrent first opens
-- agree on one id); deleting the row (a copy of the database made with pg_dump, sharing a Redis
-- with the original) makes the next open write a new one.
CREATE TABLE ctx_store (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    store_id text NOT NULL,
    created  timestamptz NOT NULL DEFAULT now()
);
