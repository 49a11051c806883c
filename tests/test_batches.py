"""data/batches.py: the batches a run's settings choose (a task chosen by name, with settings of its own), and PoSE's
skipped position ids against the paper's rule."""

import pickle

import pytest

import config
import train
from checkpoint import load_checkpoint
from conftest import flags, log, same_tensors
from data.batches import BatchConfig, make_batches
from data.recall import Recall
from data.tokenizer import load_meta

RECALL = BatchConfig.chosen("recall")


def test_pose_without_skips_trains_exactly_as_ordinary_training(data_dir, tmp_path):
    plain, pose = tmp_path / "plain", tmp_path / "pose"
    train.main(flags(data_dir, plain, "--max_iters=3", "--log_interval=1"))
    train.main(flags(data_dir, pose, "--max_iters=3", "--log_interval=1", "--pose_factor=1"))  # ids 0..T-1, given
    a, b = (load_checkpoint(d / "ckpt.pt") for d in (plain, pose))
    assert same_tensors(a["model"], b["model"]) and [m["train_loss"] for m in log(plain)] == [
        m["train_loss"] for m in log(pose)
    ]


def test_the_settings_choose_the_batches_and_a_setting_that_does_nothing_is_refused(data_dir):
    meta = load_meta(data_dir / "shakespeare_char")
    batches = make_batches(
        RECALL(recall_share=0.5, recall_pairs=2, pose_factor=2.0),
        data_dir / "shakespeare_char",
        meta,
        32,
        4,
        0,
        "cpu",
        1,
    )
    b = batches.train(0, 0)
    assert b.position_ids.shape == (4, 32) and b.position_ids.max() < 64 and (b.y == -1).any()  # the task's rows
    with pytest.raises(ValueError, match="pose_chunks=3 does nothing without a pose_factor"):
        BatchConfig(pose_chunks=3)
    with pytest.raises(ValueError, match=r"recall_pairs=20 must lie in \[1, 13\]"):
        RECALL(recall_pairs=20)
    with pytest.raises(ValueError, match=r"recall_fewest=5 must lie in \[1, recall_pairs=4\]"):
        RECALL(recall_pairs=4, recall_fewest=5)
    with pytest.raises(ValueError, match="pose_chunks=33 exceeds block_size=32: each chunk holds a token"):
        make_batches(
            BatchConfig(pose_factor=2.0, pose_chunks=33), data_dir / "shakespeare_char", meta, 32, 4, 0, "cpu", 1
        )  # in make_batches, which lab/extend.py calls too, not only in check_model


def test_a_task_is_chosen_by_name_with_its_own_settings_which_text_alone_lacks():
    (text,) = config.parse([], BatchConfig)
    (recall,) = config.parse(["--task=recall", "--recall_pairs=3"], BatchConfig)
    assert type(text) is BatchConfig and not hasattr(text, "recall_pairs") and text.task_class is None
    assert (recall.task, recall.recall_pairs, recall.task_class) == ("recall", 3, Recall)
    assert pickle.loads(pickle.dumps(recall)) == recall  # as a lab hands it to a spawned worker
    with pytest.raises(ValueError, match="task='copy' is unknown; choose one of text, recall"):
        config.parse(["--task=copy"], BatchConfig)
    with pytest.raises(ValueError, match="recall_share=0.0 must lie in"):
        RECALL(recall_share=0.0)  # the task in no row: text alone is task=text


def test_a_record_from_before_tasks_were_named_reads_as_the_task_it_trained():
    recall = {"recall_share": 0.5, "recall_pairs": 2, "recall_queries": None, "recall_fewest": None}
    assert config.current_names(BatchConfig, recall)["task"] == "recall"
    assert config.current_names(BatchConfig, recall | {"recall_share": 0.0})["task"] == "text"


def test_recall_fewest_reaches_the_task_rows_which_then_hold_from_fewest_to_pairs_needles(data_dir):
    """The setting is passed on: rows of 2 to 6 needles answer as many queries, fixed rows always 6."""
    meta = load_meta(data_dir / "shakespeare_char")

    def answers(fewest):  # queries in each task row of a few batches: an answer is two trained capitals
        batches = make_batches(
            RECALL(recall_share=1.0, recall_pairs=6, recall_fewest=fewest),
            data_dir / "shakespeare_char",
            meta,
            64,
            8,
            0,
            "cpu",
            1,
        )
        return {int(n) // 2 for it in range(4) for n in (batches.train(it, 0).y != -1).sum(-1)}

    assert answers(None) == {6}
    assert len(answers(2)) > 1 and min(answers(2)) >= 2


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--pos_emb=none"], "pose_factor=2 does nothing for pos_emb='none': it reads no position ids"),
        (
            ["--pos_emb=learned"],
            "pose_factor=2 puts position ids up to 63, past pos_emb='learned''s table of block_size=32 positions",
        ),
        (
            ["--pose_factor=1e9"],
            "pose_factor=1e+09 x block_size=32 asks for 3.2e+10 positions, past 2^24 = 16,777,216, "
            "beyond which float32 (the scores' precision) cannot tell a position from its neighbour; "
            "use pose_factor <= 524,288",
        ),
    ],
    ids=["nope", "learned table", "huge"],
)
def test_pose_where_it_cannot_act_is_refused_naming_itself_before_anything_is_written(
    data_dir, tmp_path, capsys, args, expected
):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(flags(data_dir, out, "--max_iters=2", "--pose_factor=2", *args))
    assert e.value.code == 1 and expected in capsys.readouterr().err and not out.exists()
