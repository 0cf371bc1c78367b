"""Append-only JSONL privacy ledger (McMahan & Andrew 2018, section 5).

Each round appends one line recording the sampling event and every Gaussian sum query
(privacy tuple (S_g, sigma_g)) actually executed that round (none if no client trained). The
accountant (`tff_dp.accounting`) processes the ledger post hoc, so bugs in hyperparameter
code cannot change the reported epsilon.

Line format (one JSON object per line, keys sorted, no spaces), schema version 2:

  {"record": {...}, "schema_version": 2, "seq": <n>, "sha256": "<hex>"}

where `seq` is the 1-based number of the line in the ledger (stamped by `PrivacyLedger`, not
part of `RoundRecord`) and `sha256` the SHA-256 of the canonical JSON of `{"record": ...,
"schema_version": 2, "seq": n}`. Floats are written as the shortest repr that reads back as
the same float64 (float32 values from TF are stored as their exact float64 value).
Version-1 lines (no `seq`) are still read. The checksums detect accidents (a truncated, edited
or reordered line), not forgery: anyone who can write the file can recompute them. Against
forgery a run also writes `"chain": "<hex>"`, HMAC-SHA256 under a secret key the run keeps in
secret/ledger_key (`new_mac_key`) of the previous line's MAC ('' for the first) and the same
canonical body, so the MACs commit to every earlier line and their order; and after every
append a seal (`write_seal`, secret/ledger_seal) that commits to the number of lines and the
last MAC. A reader given the key (`read_ledger(path, mac_key=..., seal_path=...)`,
`python -m tff_dp.accounting --ledger_key`) refuses a line whose MAC is missing or wrong (an
edited, moved or spliced line with a recomputed checksum) and a ledger cut short. Lines
written before chained MACs carry `"hmac"`, a MAC of the line alone, still verified.

Each line is written with a single `os.write` on an O_APPEND descriptor followed by `fsync`,
so a crash can at worst leave one partial last line (no trailing newline). Readers never skip
anything: a partial, edited or schema-invalid line raises `LedgerError` naming its line number.

Order (checked by `read_ledger` and when `PrivacyLedger` opens a ledger, so every reader of a
whole ledger goes through it): each version-2 line's `seq` equals its line number, so a
deleted, duplicated or reordered line is an error naming the first line out of place (a
deleted LAST line is indistinguishable from a crash before the append). Round numbers start
at 1 and each record's round is at most the previous record's round + 1: the next round, or
(after a resume, see tff_dp.training.run_state.resume.reconcile_ledger) a round re-executed
after a crash, whose second record is counted again: as a fresh sample with secret sampling,
as the same sample released twice with a seeded one (`SamplingEvent.seeded`). Version-1 lines
carry no `seq`, so their rounds must be exactly 1, 2, 3, ... and they cannot follow version-2
lines.
"""

from tff_dp.ledger.records import CorrelatedNoise
from tff_dp.ledger.records import GaussianSumQuery
from tff_dp.ledger.records import READABLE_SCHEMA_VERSIONS
from tff_dp.ledger.records import RoundRecord
from tff_dp.ledger.records import SCHEMA_VERSION
from tff_dp.ledger.sampling_events import EventShape
from tff_dp.ledger.sampling_events import SAMPLING_KINDS
from tff_dp.ledger.sampling_events import SamplingEvent
from tff_dp.ledger.sampling_events import register_sampling_kind
from tff_dp.ledger.values import LedgerError
from tff_dp.ledger.lines import LineMac
from tff_dp.ledger.lines import MAC_KEY_BYTES
from tff_dp.ledger.lines import SEAL_FILE
from tff_dp.ledger.lines import check_seal
from tff_dp.ledger.lines import decode_line
from tff_dp.ledger.lines import encode_record
from tff_dp.ledger.lines import new_mac_key
from tff_dp.ledger.lines import write_seal
from tff_dp.ledger.storage import PrivacyLedger
from tff_dp.ledger.storage import check_resumable
from tff_dp.ledger.storage import macs_of
from tff_dp.ledger.storage import move_records
from tff_dp.ledger.storage import read_ledger
from tff_dp.ledger.storage import read_moved_records
from tff_dp.ledger.storage import repair_truncated_tail
