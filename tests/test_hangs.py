"""The verdict: culprits first, mismatches, waiting ranks, ranks grouped by identical stack."""

import json
import os

import pytest

from exporter.hangs import codec
from exporter.hangs import verdict as hangs
from exporter.hangs.protocol import Summary
from exporter.ranklist import format_ranks
from exporter.tools import cli

pytestmark = pytest.mark.unit

TRAIN = "/job/train.py"


def _frames(*where: tuple[int, str]) -> list[dict]:
    return [{"file": TRAIN, "line": line, "function": fn} for line, fn in where]


def _summary(rank: int, frames: list[dict], inflight: list[dict]) -> dict:
    return {
        "rank": rank,
        "step": 7,
        "phase": "data",
        "frames": frames,
        "where": frames[-1],
        "inflight": inflight,
        "seqs": {},
    }


def _episode(**kw) -> dict:
    base = {
        "episode": 1,
        "run": "r",
        "pg": "0",
        "kind": "behind",
        "seq": 41,
        "behind": [2],
        "waiting": [0, 1, 3, 4, 5],
        "age": 12.0,
        "threshold": 10.0,
        "world_size": 7,
        "last_enqueued": {"2": 40, "6": 39},
    }
    base.update(kw)
    return base


def _six_ranks() -> dict:
    waiting = _frames((90, "<module>"), (60, "train_step"))
    stuck = _frames((90, "<module>"), (55, "train_step"), (57, "load_batch"))
    ar = [{"op": "all_reduce", "seq": 41, "pg": "0"}]
    out = {r: _summary(r, waiting, ar) for r in (0, 1, 3, 4, 5)}
    out[2] = _summary(2, stuck, [])
    out[6] = None  # never answered
    return out


def test_culprits_first_then_waiting_then_groups():
    v = _verdict(_episode(), _six_ranks())
    assert v.culprits[0] == (
        "rank 2 never entered all_reduce #41 (pg 0); it is at train.py:57 in load_batch "
        "(step 7, phase data)"
    )
    assert v.culprits[1].startswith("rank 6 did not answer the dump request")
    # With the silent rank's node known (from its start ack), the verdict names it.
    named = _verdict({**_episode(), "nodes": {"6": "n6"}}, _six_ranks())
    assert named.culprits[1].startswith("rank 6 (node n6) did not answer the dump request")
    assert "cut off from the store's (network, firewall)" in named.culprits[1]
    assert v.missing == [6]
    assert v.located == [
        {
            "rank": 2,
            "op": "all_reduce",
            "seq": 41,
            "pg": "0",
            "file": TRAIN,
            "line": 57,
            "function": "load_batch",
        }
    ]
    assert v.waiting == [
        "rank 0-1,3-5 wait in all_reduce #41 (pg 0), called at train.py:60 in train_step"
    ]
    # Six answering ranks, two distinct stacks: two groups, the odd one first.
    assert [g[0] for g in v.groups] == [[2], [0, 1, 3, 4, 5]]
    text = hangs.render(v)
    assert text.index("CULPRITS") < text.index("WAITING") < text.index("STACKS")
    assert "rank 0-1,3-5 (5 ranks):" in text
    assert "6/7 ranks answered" in v.header


def _verdict(episode: dict, summaries: dict) -> hangs.Verdict:
    """Return the verdict of an episode and summaries written as the files hold them."""
    typed = {r: None if s is None else codec.from_dict(Summary, s) for r, s in summaries.items()}
    return hangs.verdict(codec.episode_from_dict(episode), typed)


def test_mismatch_names_both_ops():
    frames = _frames((10, "main"))
    summaries = {
        0: _summary(0, frames, [{"op": "all_reduce", "seq": 12, "pg": "0"}]),
        1: _summary(1, frames, [{"op": "broadcast", "seq": 12, "pg": "0"}]),
    }
    ep = _episode(kind="symmetric", seq=12, behind=[], waiting=[0, 1], world_size=2)
    v = _verdict(ep, summaries)
    assert v.mismatches == ["collective #12 (pg 0): rank 0 in all_reduce, rank 1 in broadcast"]
    assert "no rank is behind" in v.culprits[0]
    assert v.header.startswith(
        "hang episode 1 in run r: symmetric hang in pg 0 at all_reduce/broadcast #12"
    )


def test_ranks_text():
    assert format_ranks([5, 0, 1, 2, 7, 8], ranges=True) == "0-2,5,7-8"
    assert format_ranks([3], ranges=True) == "3"


def test_cli_reads_newest_episode_and_reports_missing_folder(tmp_path, capsys):
    folder = tmp_path / "r-hang-1"
    folder.mkdir()
    ep = _episode(summaries={str(r): s for r, s in _six_ranks().items()})
    (folder / "episode.json").write_text(json.dumps(ep))
    assert cli.main(["hangs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rank 2 never entered all_reduce #41 (pg 0); it is at train.py:57" in out
    assert cli.main(["hangs", str(tmp_path / "nothing")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ddp-exporter hangs: no hang episode"), err
    assert os.path.basename(hangs.find_episode(str(tmp_path))) == "r-hang-1"


def _dump(rank: int, frames: list[dict], inflight: list[dict]) -> dict:
    """Return a rank file as exporter.hangs.watcher writes it (only the fields the verdict reads)."""
    return {
        "rank": rank,
        "run": "r",
        "world_size": 3,
        "step": 7,
        "phase": "data",
        "threads": [{"name": "MainThread", "training": True, "exporter": False, "frames": frames}],
        "flight_recorder": {"available": True, "inflight": inflight, "recent": []},
        "request": {
            k: v for k, v in _episode().items() if k not in ("world_size", "run", "last_enqueued")
        },
    }


def test_rank_files_of_one_node_do_not_call_other_nodes_silent(tmp_path):
    folder = tmp_path / "r-hang-1"
    folder.mkdir()
    ar = [{"op": "all_reduce", "seq": 41, "pg": "0"}]
    (folder / "rank-0.json").write_text(json.dumps(_dump(0, _frames((60, "train_step")), ar)))
    (folder / "rank-1.json").write_text(json.dumps(_dump(1, _frames((60, "train_step")), ar)))
    episode, summaries = hangs.load_episode(str(folder))
    v = hangs.verdict(episode, summaries)
    assert v.culprits == [
        "rank 2 never entered all_reduce #41 (pg 0); its dump is not in this folder (another "
        "node's disk)"
    ]
    assert "dumps of 2/3 ranks in this folder" in v.header


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("rank-0.json", "[1]", "not a rank's dump: expected a JSON object, got list"),
        ("rank-0.json", '{"rank": "x"}', "not a rank's dump: invalid literal for int()"),
        ("rank-0.json", "{}", "not a rank's dump: no field 'rank'"),
        ("rank-0.json", '{"rank": 0, "thre', "not JSON (Unterminated string"),
        ("episode.json", "null", "not an episode: expected a JSON object, got NoneType"),
        # Listing each missing rank of a world this large took as long as that.
        (
            "episode.json",
            '{"request": {"episode": 1}, "world_size": 1000000000000}',
            "not an episode: world_size 1000000000000 is not a job's (1 to 4194304)",
        ),
        ("rank-0.json", '{"rank": 9, "world_size": 4}', "not a rank's dump: rank 9 is not one"),
    ],
)
def test_a_folder_of_unreadable_files_is_one_line_naming_the_file(
    tmp_path, capsys, name, text, why
):
    folder = tmp_path / "r-hang-1"
    folder.mkdir()
    (folder / name).write_text(text)
    assert cli.main(["hangs", str(folder)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(
        f"ddp-exporter hangs: no readable episode in {folder}: {folder / name}: {why}"
    )
    with pytest.raises(ValueError, match=f"^{folder / name}: "):
        hangs.load_episode(str(folder))  # without a list of skipped files: the first one raises


def test_an_unreadable_rank_file_is_skipped_with_a_note_and_the_others_judged(tmp_path, capsys):
    folder = tmp_path / "r-hang-1"
    folder.mkdir()
    ar = [{"op": "all_reduce", "seq": 41, "pg": "0"}]
    (folder / "rank-0.json").write_text(json.dumps(_dump(0, _frames((60, "train_step")), ar)))
    (folder / "rank-1.json").write_text('{"rank": 1, "threads": [{"na')  # killed as it wrote
    assert cli.main(["hangs", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert err.startswith(f"ddp-exporter hangs: skipped {folder / 'rank-1.json'}: not JSON ("), err
    assert err.count("\n") == 1 and "dumps of 1/3 ranks in this folder" in out, out
