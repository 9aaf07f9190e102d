"""Your own inputs are keyed by their content (issue 31.2): image folders and image lists by the
bytes of every image, remembered by path, size, times and inode so a rerun reads nothing again;
symbolic links followed once per real folder or image, loops and dangling links refused in one
line; your own shard folders recorded at first use, so that later bit rot is refused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from PIL import Image
from test_bad_inputs import byof_pipeline, etn
from test_own_data_inputs import GOOD_TREE, vision

from etn_cli.datasets import datasets
from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.store import content


def write_images(folder: Path, count: int, value: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.fromarray(np.full((4, 4, 3), value + 30 * i, np.uint8)).save(folder / f"i{i}.png")


def key(root: Path, split: str = "train", **options: object) -> str:
    source = datasets.get("image_folder")(root=str(root), **options)
    return source.split_fingerprint(split)["files_sha256"]


def rewrite_keeping_size_and_time(path: Path, change: bytes) -> None:
    """New bytes of the same length, the modification time set back (as ``cp -p`` or a
    careless tool would): only the content and the status-change time differ."""
    stat = path.stat()
    raw = bytearray(path.read_bytes())
    raw[-len(change) :] = change
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size


@pytest.fixture(autouse=True)
def fresh_memo(tmp_path: Path):
    """Each test with its own memo file, as one data directory."""
    content._MEMOS.clear()
    content.use_data_dir(tmp_path / "data")
    yield
    content._MEMOS.clear()


def test_an_image_with_the_same_name_size_and_time_but_new_pixels_is_a_new_key(tmp_path) -> None:
    write_images(tmp_path / "train" / "a", 2)
    write_images(tmp_path / "train" / "b", 2, value=100)
    before = key(tmp_path)
    rewrite_keeping_size_and_time(tmp_path / "train" / "b" / "i1.png", b"\x00\x01\x02\x03")
    assert key(tmp_path) != before


def test_an_image_list_is_keyed_by_the_images_it_names(tmp_path) -> None:
    write_images(tmp_path / "img", 3)
    (tmp_path / "list.txt").write_text("img/i0.png 0\nimg/i1.png 1\nimg/i2.png 0\n")
    options = {"lists": {"val": "list.txt"}}
    source = datasets.get("image_list")
    before = source(root=str(tmp_path), **options).split_fingerprint("val")
    write_images(tmp_path / "img", 3, value=7)  # the same names, new pixels
    after = source(root=str(tmp_path), **options).split_fingerprint("val")
    assert before["list_sha256"] != after["list_sha256"]


def test_a_rerun_hashes_only_what_changed(tmp_path, monkeypatch) -> None:
    write_images(tmp_path / "train" / "a", 3)
    write_images(tmp_path / "train" / "b", 3, value=100)
    first = key(tmp_path)
    content.save_memos()
    content._MEMOS.clear()  # a new process reads the memo from the data directory
    read: list[str] = []
    real = content.file_digest

    def counted(path: Path, algorithm: str = "xxh3-128") -> str:
        read.append(str(path))
        return real(path, algorithm)

    monkeypatch.setattr(content, "file_digest", counted)
    assert key(tmp_path) == first and read == []
    write_images(tmp_path / "train" / "b", 1, value=9)  # rewrites b/i0.png only
    assert key(tmp_path) != first
    assert [Path(p).name for p in read] == ["i0.png"]


def test_a_damaged_memo_is_dropped_not_trusted(tmp_path) -> None:
    write_images(tmp_path / "train" / "a", 2)
    write_images(tmp_path / "train" / "b", 2, value=100)
    first = key(tmp_path)
    content.save_memos()
    memo = tmp_path / "data" / "features" / content.CONTENT_MEMO
    memo.write_text(memo.read_text().replace('"xxh3-128":"', '"xxh3-128":"0', 1))  # seal broken
    content._MEMOS.clear()
    assert key(tmp_path) == first


def test_a_symlink_loop_is_refused_in_one_line(tmp_path) -> None:
    write_images(tmp_path / "train" / "dog", 2)
    write_images(tmp_path / "train" / "cat", 2)
    (tmp_path / "train" / "dog" / "loop").symlink_to(".")
    with pytest.raises(EtnError, match="symbolic link loop") as caught:
        key(tmp_path)
    assert "\n" not in str(caught.value) and "dog/loop" in str(caught.value)


def test_links_are_followed_once_per_real_folder_and_image(tmp_path) -> None:
    write_images(tmp_path / "train" / "dog", 2)
    write_images(tmp_path / "train" / "cat", 2)
    write_images(tmp_path / "shared", 1, value=200)
    (tmp_path / "train" / "cat" / "more").symlink_to(tmp_path / "shared")  # a folder elsewhere
    (tmp_path / "train" / "cat" / "again").symlink_to(tmp_path / "shared")  # the same, twice
    (tmp_path / "train" / "dog" / "copy.png").symlink_to(tmp_path / "train" / "dog" / "i0.png")
    split = datasets.get("image_folder")(root=str(tmp_path)).load_split("train")
    names = sorted(Path(f).as_posix() for f in split.data.files)
    assert names == ["cat/again/i0.png", "cat/i0.png", "cat/i1.png", "dog/i0.png", "dog/i1.png"]


def test_a_dangling_symlinked_image_is_refused_in_one_line(tmp_path) -> None:
    write_images(tmp_path / "train" / "dog", 2)
    write_images(tmp_path / "train" / "cat", 2)
    (tmp_path / "train" / "cat" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(EtnError, match="cat/gone.png .* is a link to .*nowhere.png, unreadable"):
        key(tmp_path)


def test_a_label_beyond_any_class_index_is_one_line(tmp_path) -> None:
    write_images(tmp_path / "img", 1)
    (tmp_path / "list.txt").write_text("img/i0.png 100000000000000000000\n")
    with pytest.raises(EtnError, match="list.txt:1 gives label 100000000000000000000"):
        key(tmp_path, "list.txt")


def test_inverted_test_images_of_the_same_size_are_extracted_again(tmp_path, capsys) -> None:
    """The attack's case: every test image inverted, sizes and times kept; the next run must
    extract the test split again, not find it up to date."""
    pipeline = vision(tmp_path, {**GOOD_TREE, "ood": 2})
    assert etn(capsys, "extract", pipeline, "-d", tmp_path / "d")[0] == 0
    for path in sorted((tmp_path / "images" / "test").rglob("*.png")):
        stat = path.stat()
        inverted = 255 - np.asarray(Image.open(path))
        Image.fromarray(inverted).save(path)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with mock.patch("test_bad_inputs.without_progress", lambda err: err):  # keep those lines
        code, err = etn(capsys, "extract", pipeline, "-d", tmp_path / "d")
    assert code == 0 and "image_folder.test: started" in err, err
    assert "image_folder.adapt: skipped" in err


def test_bit_rot_in_your_own_shard_folder_is_refused_after_first_use(tmp_path, capsys) -> None:
    pipeline = byof_pipeline(tmp_path)
    data = tmp_path / "data"
    assert etn(capsys, "run", pipeline, "-d", data)[0] == 0
    shard = tmp_path / "mine" / "test" / "shard-00000.h5"
    kept = shutil.copy2(shard, tmp_path / "kept.h5")
    rewrite_keeping_size_and_time(shard, b"\x3f\x80")  # a flip in the last values, time kept
    code, err = etn(capsys, "run", pipeline, "-d", data)
    assert code == 2 and err.count("\n") == 1 and "changed without being written" in err, err
    assert "test/shard-00000.h5" in err
    shutil.copy2(kept, shard)  # restored from a copy: used again
    assert etn(capsys, "run", pipeline, "-d", data)[0] == 0
    shard.write_bytes(shard.read_bytes())  # written anew: new data, not damage
    assert etn(capsys, "run", pipeline, "-d", data)[0] == 0


def test_a_garbage_manifest_in_your_feature_folder_is_one_line(tmp_path, capsys) -> None:
    pipeline = byof_pipeline(tmp_path)
    (tmp_path / "mine" / "far" / "manifest.json").write_text("{not json")
    code, err = etn(capsys, "train", pipeline, "-d", tmp_path / "data")
    assert code == 2 and err.count("\n") == 1 and "far/manifest.json is not valid JSON" in err
    (tmp_path / "mine" / "far" / "manifest.json").write_text("{}")
    code, err = etn(capsys, "train", pipeline, "-d", tmp_path / "data")
    assert code == 2 and err.count("\n") == 1 and "far/manifest.json" in err, err
    assert not [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    with pytest.raises(DamagedArtefact):
        from etn_cli.store.writing.manifest import load_manifest

        load_manifest(tmp_path / "mine" / "far")


def test_a_folder_first_read_when_the_heads_exist_is_recorded_and_its_bit_rot_refused(
    tmp_path, capsys
) -> None:
    pipeline = byof_pipeline(tmp_path)
    data = tmp_path / "data"
    assert etn(capsys, "run", pipeline, "-d", data)[0] == 0
    shard = tmp_path / "mine" / "near" / "shard-00000.h5"  # a new OOD folder, heads built
    shutil.copytree(tmp_path / "mine" / "far", shard.parent)
    pipeline.write_text(pipeline.read_text().replace('"mine/far"]', '"mine/far", "mine/near"]'))
    code, err = etn(capsys, "run", pipeline, "-d", data)
    assert code == 0 and "train: 0 built" in err, err  # only evaluate read the new folder
    rewrite_keeping_size_and_time(shard, b"\x3f\x80")
    code, err = etn(capsys, "run", pipeline, "-d", data)
    assert code == 2 and "changed without being written" in err and "near/shard" in err, err
    for repair in ([], ["--repair"]):  # verify says so too, and never removes your folder
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            main_verify(["verify", "-d", str(data), *repair])
        out = capsys.readouterr().out
        assert exit_.value.code == 1 and f"DAMAGED {shard.parent}" in out, out
        assert shard.is_file()


def main_verify(args: list[str]) -> None:
    from unittest import mock

    from etn_cli.cli.app import main

    with mock.patch("sys.argv", ["etn", *args]):
        main()
