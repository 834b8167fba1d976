"""The job store's tables, as the migrations that made them: migration N takes a database from schema N-1
(0: empty) to N, and `PRAGMA user_version` says which a database has reached (runner/records/store.py applies them).

A migration, once released, never changes: a database is only ever moved forward by new ones.
"""

IDS_PER_STATEMENT = 500  # SQLite before 3.32 takes at most 999 parameters in one statement

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: an id is never reused
        name TEXT,
        state TEXT NOT NULL,
        spec TEXT NOT NULL,            -- JSON: source (the work dir snapshotted), script, args, command, env
        job_dir TEXT NOT NULL,
        checkpoint_dir TEXT NOT NULL,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        exit_code INTEGER,
        signal INTEGER,
        pid INTEGER,
        shim_pid INTEGER,
        shim_start INTEGER,
        boot_id TEXT,
        reason TEXT
    );
    CREATE INDEX jobs_state ON jobs(state);
    CREATE INDEX jobs_name ON jobs(name, id);
    -- No longer written: it holds what older tfrunds wrote there, which `rm` and `prune` remove with the job.
    -- Kept, as dropping it takes a schema version that an older tfrund would refuse to open.
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        detail TEXT
    );
    CREATE INDEX events_job ON events(job_id, id);
    """,
    2: """
    ALTER TABLE jobs ADD COLUMN restarted_as INTEGER;  -- the job that runs this one again
    """,
    3: """
    -- A job's alert settings, apart from its record: its URLs hold secrets that no client may see.
    CREATE TABLE job_alerts (
        job_id INTEGER PRIMARY KEY REFERENCES jobs(id),
        rules TEXT NOT NULL,           -- JSON {rule: setting or null}: what watches this job
        notify TEXT NOT NULL,          -- JSON [url]: where its alerts go besides the daemon's URLs (secret)
        patterns TEXT NOT NULL         -- JSON [regex]: its own metric patterns
    );
    -- Where the watch over each job's output stands, so that a new daemon resumes it and alerts nothing twice;
    -- a row from the job's start until its end alerts are stored.
    CREATE TABLE watches (
        job_id INTEGER PRIMARY KEY REFERENCES jobs(id),
        state TEXT NOT NULL            -- JSON: log offset, metric reader and spike detector state, ...
    );
    -- The outbox: an alert is stored here before anything is sent.
    CREATE TABLE alerts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER,                -- NULL for the box's own alerts (gpu-memory)
        rule TEXT NOT NULL,
        at REAL NOT NULL,
        summary TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX alerts_job_rule ON alerts(job_id, rule, at);
    CREATE TABLE deliveries (
        id INTEGER PRIMARY KEY,
        alert_id INTEGER NOT NULL REFERENCES alerts(id),
        url TEXT NOT NULL,             -- secret: never leaves the daemon
        target TEXT NOT NULL,          -- the URL with its secrets masked
        state TEXT NOT NULL,           -- pending, sent, expired
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        sent_at REAL,
        error TEXT                     -- the last failure, secrets masked
    );
    CREATE INDEX deliveries_due ON deliveries(state, next_at);
    """,
    4: """
    ALTER TABLE jobs ADD COLUMN prepared INTEGER NOT NULL DEFAULT 0;  -- its work dir is built: it may start
    ALTER TABLE jobs ADD COLUMN gpus TEXT;     -- JSON [device id]: the GPUs it was given (NULL: not scheduled)
    ALTER TABLE jobs ADD COLUMN waiting TEXT;  -- why a queued job has not started yet
    """,
    5: """
    -- The client's id of the submit that made the job (NULL for restarts and older clients): the same submit
    -- sent again, after a daemon died before answering it, finds this job instead of making a second one.
    ALTER TABLE jobs ADD COLUMN submission_id TEXT;
    CREATE UNIQUE INDEX jobs_submission ON jobs(submission_id);
    """,
    6: """
    -- A task of an array (submit --array): the array's id (its first task's job id) and the task's index;
    -- NULL for any other job. A restart of a task stays in its array.
    ALTER TABLE jobs ADD COLUMN array_id INTEGER;
    ALTER TABLE jobs ADD COLUMN array_index INTEGER;
    CREATE INDEX jobs_array ON jobs(array_id, array_index);
    """,
    7: """
    -- Why a failed or lost job ended, as submit --restart-on names causes: lost, oom, signal or error (NULL:
    -- it did not fail, or it ended under an older tfrund). Written in the move that ends it, with its restart.
    ALTER TABLE jobs ADD COLUMN cause TEXT;
    """,
    8: """
    -- This database's own random id, made once: it names the checkpoint folders of its jobs (N-ID), so that two
    -- daemons (two homes) on one checkpoint root never take or delete each other's, whatever their job ids.
    CREATE TABLE daemon (id TEXT NOT NULL);
    INSERT INTO daemon (id) VALUES (lower(hex(randomblob(6))));
    """,
    9: """
    -- An ended job's record as `tfrun ps --json` prints it, kept the first time it is listed, so that a history
    -- is read as text and not decoded and encoded again at every listing. `form` names the record's layout and
    -- the tfrun that wrote it (a text of another form is not used). A write to the job's row or to its alert
    -- settings drops its text (the triggers, whatever tfrund writes: one text is never stale).
    CREATE TABLE job_texts (
        job_id INTEGER PRIMARY KEY,
        form TEXT NOT NULL,
        text TEXT NOT NULL
    );
    CREATE TRIGGER job_texts_job_updated AFTER UPDATE ON jobs
        BEGIN DELETE FROM job_texts WHERE job_id = OLD.id; END;
    CREATE TRIGGER job_texts_job_deleted AFTER DELETE ON jobs
        BEGIN DELETE FROM job_texts WHERE job_id = OLD.id; END;
    CREATE TRIGGER job_texts_alerts_added AFTER INSERT ON job_alerts
        BEGIN DELETE FROM job_texts WHERE job_id = NEW.job_id; END;
    CREATE TRIGGER job_texts_alerts_updated AFTER UPDATE ON job_alerts
        BEGIN DELETE FROM job_texts WHERE job_id = OLD.job_id OR job_id = NEW.job_id; END;
    CREATE TRIGGER job_texts_alerts_deleted AFTER DELETE ON job_alerts
        BEGIN DELETE FROM job_texts WHERE job_id = OLD.job_id; END;
    """,
    10: """
    -- The uploads of checkpoints to object storage (runner/storage/): one row a checkpoint found complete in a
    -- job's checkpoint folder, kept until it is stored (or gone from the box first), so that a daemon killed
    -- mid-upload, or a storage outage of any length, loses none. A checkpoint saved again under its name (a
    -- Keras file rewritten every epoch) is a new row: `saved_at` tells them apart.
    CREATE TABLE uploads (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL,       -- the job that was running when it was found (any of a restart chain)
        folder TEXT NOT NULL,          -- the checkpoint folder it is in
        place TEXT NOT NULL,           -- the job's stored folder (s3://bucket/prefix/NAME-TOKEN)
        name TEXT NOT NULL,            -- the checkpoint: a TF prefix, or a file's path in the folder
        kind TEXT NOT NULL,            -- tensorflow, file, or job (the job's record and snapshot)
        files TEXT NOT NULL,           -- JSON [[path, size, mtime_ns, inode]] as found complete
        saved_at REAL NOT NULL,
        state TEXT NOT NULL,           -- waiting, stored, gone (deleted on the box before it was stored)
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL,         -- when it is tried (again)
        failing_since REAL,            -- the first failure of the current run of them: an outage's start
        stored_at REAL,
        done TEXT NOT NULL DEFAULT '[]',  -- JSON [[path, size, sha256]]: its files already uploaded and verified
        error TEXT                     -- the last failure, in one line
    );
    CREATE UNIQUE INDEX uploads_checkpoint ON uploads(folder, name, saved_at);
    CREATE INDEX uploads_due ON uploads(state, next_at);
    """,
}
