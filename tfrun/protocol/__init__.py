"""The whole wire format between `tfrun` and `tfrund`, in this package.

A connection carries frames. A frame is one line of JSON (the header, at most MAX_HEADER_BYTES) naming
its message type in "type"; a message with a `data: bytes` field sends those bytes raw right after the
header, their length in the header's "size", so log bytes cross without base64 or re-encoding.

A conversation: the client sends `Hello`, the daemon answers `Hello` (or `Error` with code
"version_mismatch"); then the client sends requests, each answered by one response, except `ReadLog`
(any number of `LogChunk` or `LogLines`, then one `LogEnd`), `ReadFile` (`FileChunk`s, the last one marked)
and a `ListJobs` that asks for `text` (`JobList` parts of the list's JSON text, each but the last `more`). A
submit uploads first: `HaveBlobs` names the contents of the work dir by SHA-256, the daemon answers
with the ones it lacks, the client sends those, small ones packed together in `PutBlobs` and large ones
in `PutBlob` chunks (each frame of `PutBlobs` and each last chunk answered by `Ok`, so the client may
send many before reading), then `Submit` lists the files. Either side may close
after a response. Each request class names what answers it (`class Wait(Request[JobReply])`), and
`Channel.ask` checks every reply against that in one place.

Strings are JSON with non-ASCII escaped, so a file name that is not UTF-8 (held as Python's
surrogate escapes) crosses intact and becomes the same bytes on the other side.

Every message is checked on the way in against the types declared here, so a malformed or hostile frame
is refused with an `Error` instead of reaching a handler. The declarations carry the bounds (see `fields`
below): a number outside its `Range`, a list or string beyond its `Limit`, a float that is NaN or
infinite, a surrogate escape in a `Text` field (job names and references, patterns, URLs: what SQLite stores
and RE2 compiles) never reaches a handler. An int with no declared range is a signed 64-bit integer.

Where each part lives (a verb imports only the modules it asks with: a local `tfrun ps` creates 21 message
classes, not 66):

- `fields`: job states, error codes, the field types that carry bounds (`Text`, `JobRef`, `Range`, `Limit`)
  and the checks every incoming value passes;
- `wire`: `Message` and `Request[R]`, the handshake's `Hello`, `Error`, `Ok`, and frames: `encode`,
  `decode_header`, `read_message`, `write_message`; `PROTOCOL_VERSION`;
- `channel`: a client's conversation (`Channel.ask`, `check_reply`, `RemoteError`);
- `proof`: the challenge a client's hello may carry and the daemon's answer to it, with which a daemon behind a
  remembered socket path proves it is the user's own (the SSH fast path);
- the messages, by conversation, each module with its handlers in runner/handlers/ of the same name: `jobs`
  (the `Job` record; list, get, wait, cancel, restart), `submit` (the snapshot's manifest, its blobs,
  `Submit`), `logs` (`ReadLog` and its stream, `Attach`), `files` (`ListFiles`, `ReadFile`), `storage`
  (`ListStored`, `Resume`: checkpoints in object storage), `watching`
  (alerts, metrics, GPUs, top), `services` (TensorBoard, Jupyter), `housekeeping` (remove, prune, disk),
  `admin` (daemon status, config, doctor).

Glossary: a *message* is one frame's content; a *request* is a message a client sends, answered by its
*reply* (or a stream of them); a *record* (`Job`, `Alert`, `FileEntry`) is a dataclass carried inside messages.
"""
