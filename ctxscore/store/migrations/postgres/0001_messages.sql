-- ctxscore PostgreSQL store, version 1: sessions and their original messages.
-- Applied by ctxscore.store.migrations in one transaction under an advisory lock; never edit an
-- applied file (its checksum is recorded): add a new numbered file instead.

-- One row per session: the lock writers of the session take (turn allocation), the count of
-- sessions detached from it (names the next one) and an epoch bumped when messages leave it.
CREATE TABLE ctx_sessions (
    session_id text PRIMARY KEY,
    created    timestamptz NOT NULL DEFAULT now(),
    detached   integer NOT NULL DEFAULT 0,
    epoch      bigint NOT NULL DEFAULT 0
);

-- The original messages. text/context are the rendered text and the index context (a NUL
-- character, which PostgreSQL text cannot hold, is stored as U+FFFD there and the exact text as
-- JSON in text_exact); itext is the part of a long text that is indexed (NULL: all of it); ntok is
-- the document length of the keyword ranking (trigrams of the indexed text + context); stems and
-- stems_ctx are the words of SQLite's Porter-stemmed index that a query can match (space-separated),
-- stem_ntok that index's document length (ctxscore.store.stemming); message is the original OpenAI-style message
-- as JSON text, prediction the scorer's output as JSON text.
CREATE TABLE ctx_messages (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id text NOT NULL,
    id         text NOT NULL,
    turn       integer NOT NULL,
    role       text NOT NULL,
    text       text NOT NULL,
    text_exact text,
    itext      text,
    context    text NOT NULL DEFAULT '',
    ntok       integer NOT NULL,
    stems      text NOT NULL,
    stems_ctx  text NOT NULL,
    stem_ntok  integer NOT NULL,
    message    text NOT NULL,
    prediction text,
    tier       text NOT NULL DEFAULT 'verbatim',
    embedding  bytea,
    CONSTRAINT ctx_messages_session_id UNIQUE (session_id, id),
    CONSTRAINT ctx_messages_session_turn UNIQUE (session_id, turn)
);
