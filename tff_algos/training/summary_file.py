"""summary.json: a run's record of what it did, sealed with a crc of its
values (`sealed`) and read back checked (`read`), so that a changed byte is
refused instead of reported. No TensorFlow (`experiments.report` reads it)."""

from __future__ import annotations

import json
from typing import Any
import zlib

from tff_algos.errors import UserError


def _crc(summary: dict[str, Any]) -> int:
  body = {k: v for k, v in summary.items() if k != 'crc'}
  return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def sealed(summary: dict[str, Any]) -> dict[str, Any]:
  """`summary` as summary.json holds it: JSON values (others as their str())
  and a 'crc' of them, so that `read` refuses a changed byte instead
  of reporting it."""
  plain = json.loads(json.dumps(summary, default=str))  # what a reader loads
  return dict(plain, crc=_crc(plain))


def read(path: str) -> dict[str, Any]:
  """A run's summary.json, checked against its 'crc' (one written without
  one is taken as it is); `UserError` naming the fix for a damaged one (the
  run's command rebuilds it exactly from the checkpoint)."""
  try:
    with open(path, 'rb') as f:
      summary = json.loads(f.read().decode())
    if not isinstance(summary, dict):
      raise ValueError('not a JSON object')
    if 'crc' in summary and summary['crc'] != _crc(summary):
      raise ValueError('checksum mismatch')
  except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
    reason = str(e) if str(e) in ('not a JSON object', 'checksum mismatch') else type(e).__name__
    raise unreadable(path, reason) from None
  return summary


def unreadable(path: str, reason: str) -> UserError:
  """The refusal of a damaged summary.json, with its fix."""
  return UserError(f'{path} is unreadable ({reason}); rerun the run\'s experiments.train '
                   'command to rebuild it (it is rebuilt exactly from the checkpoint)')
