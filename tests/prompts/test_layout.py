"""History layouts: MAI-UI §A.6 and Qwen3-VL "Step i:" summaries (no processor needed)."""

from __future__ import annotations

from cua_native.actions.dialects import get_dialect
from cua_native.gym.protocol import Task
from cua_native.prompts import HistoryStep, default_prompt_config, render_messages

OPEN = (
    "<thinking>\nOpening Settings app to start the task\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"open","text":"Settings"}}\n</tool_call>'
)
CLICK = (
    "<thinking>\nClicking on Network settings\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n</tool_call>'
)
ASK = (
    "<thinking>\nNeed user input\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"ask_user","text":"What\'s your name?"}}\n</tool_call>'
)
DRAG = (
    "<thinking>\nMove it\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"drag","start_coordinate":[100,200],'
    '"end_coordinate":[300,400]}}\n</tool_call>'
)
MCP = (
    "<thinking>\nCheck weather\n</thinking>\n<tool_call>\n"
    '{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'
)
TASK = Task(task_id="t1", instruction="Turn on Wi-Fi and tell me 你好 🙂")


def _mai_step(text: str, image, feedback: str | None = None) -> HistoryStep:
    return HistoryStep(image, get_dialect("mai_ui").parse(text), text, feedback)


def _kinds(messages: list[dict]) -> list[str]:
    out = []
    for message in messages:
        part = message["content"][0]
        out.append(f"{message['role']}:{'image' if part['type'] == 'image_url' else 'text'}")
    return out


def test_mai_ui_history_layout(make_prepared) -> None:
    shots = [make_prepared(shade=i) for i in range(6)]
    history = [
        _mai_step(OPEN, shots[0]),
        _mai_step(CLICK, shots[1]),
        _mai_step(DRAG, shots[2]),
        _mai_step(ASK, shots[3], feedback="My name is Alice"),
        HistoryStep(
            shots[4],
            get_dialect("mai_ui").parse("I am confused"),
            "I am confused",
            "No <tool_call> found; answer with a tool call.",
        ),
    ]
    config = default_prompt_config("mai_ui")
    messages, images = render_messages(TASK, history, shots[5], config)
    assert _kinds(messages) == [
        "system:text",
        "user:text",
        "assistant:text",
        "assistant:text",
        "assistant:text",
        "user:image",
        "assistant:text",
        "user:text",
        "user:image",
        "assistant:text",
        "user:text",
        "user:image",
    ]
    texts = [m["content"][0].get("text") for m in messages]
    assert texts[1] == TASK.instruction
    assert texts[2] == OPEN and texts[3] == CLICK and texts[6] == ASK  # re-serialised exactly
    assert '"start_coordinate":[100,200],"end_coordinate":[300,400]' in texts[4]  # no float bug
    assert texts[7] == "My name is Alice"
    assert texts[9] == "I am confused"  # parse-error turn: raw text, then the feedback
    assert texts[10] == "No <tool_call> found; answer with a tool call."
    assert images == [shots[3], shots[4], shots[5]]
    urls = [m["content"][0]["image_url"]["url"] for m in messages if _kinds([m])[0] == "user:image"]
    assert urls == [im.data_url for im in images]


def test_mai_ui_first_turn_and_mcp_name_kept(make_prepared) -> None:
    config = default_prompt_config(
        "mai_ui", variant="ask_user_mcp", mcp_tools=({"name": "get_weather"},)
    )
    current = make_prepared()
    messages, images = render_messages(TASK, [], current, config)
    assert _kinds(messages) == ["system:text", "user:text", "user:image"] and images == [current]
    history = [_mai_step(MCP, make_prepared(shade=1), feedback='{"temp": 21}')]
    messages, _ = render_messages(TASK, history, current, config)
    assert '"name":"get_weather"' in messages[3]["content"][0]["text"]
    assert messages[4] == {"role": "user", "content": [{"type": "text", "text": '{"temp": 21}'}]}


def test_mai_ui_history_images_window(make_prepared) -> None:
    shots = [make_prepared(shade=i) for i in range(5)]
    history = [_mai_step(CLICK, s) for s in shots[:4]]
    one = default_prompt_config("mai_ui", history_images=1)
    assert render_messages(TASK, history, shots[4], one)[1] == [shots[4]]
    capped = default_prompt_config("mai_ui", history_images=5, max_images=2)
    assert render_messages(TASK, history, shots[4], capped)[1] == [shots[3], shots[4]]


QWEN_ACTION = (
    'Thought: The search bar is at the top.\nAction: "I tapped on the search bar."\n'
    '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [447, 81]}}'
    "\n</tool_call>"
)
QWEN_BARE = '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "type", "text": "Musk"}}\n</tool_call>'


def test_qwen_step_summaries(make_prepared) -> None:
    dialect = get_dialect("qwen3_vl")
    shots = [make_prepared(shade=i) for i in range(4)]
    history = [
        HistoryStep(shots[0], dialect.parse(QWEN_ACTION), QWEN_ACTION),
        HistoryStep(shots[1], dialect.parse(QWEN_BARE), QWEN_BARE),
        HistoryStep(shots[2], dialect.parse("oops"), "oops", "Use a <tool_call> block."),
    ]
    config = default_prompt_config("qwen3_vl")
    messages, images = render_messages(TASK, history, shots[3], config)
    assert images == [shots[3]]
    assert [m["role"] for m in messages] == ["system", "user"]
    text, image = messages[1]["content"]
    assert text["text"] == (
        f"The user query: {TASK.instruction}.\nTask progress (You have done the following "
        "operation on the current device): Step 1: I tapped on the search bar.; "
        'Step 2: {"name": "mobile_use", "arguments": {"action": "type", "text": "Musk"}}; '
        "Step 3: Invalid output (format error); Feedback: Use a <tool_call> block.; .\n"
    )
    assert image == {"type": "image_url", "image_url": {"url": shots[3].data_url}}


def test_qwen_more_history_images_and_mobileworld_feedback(make_prepared) -> None:
    dialect = get_dialect("qwen3_vl")
    shots = [make_prepared(shade=i) for i in range(3)]
    ask = '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "ask_user", "text": "Which?"}}\n</tool_call>'
    history = [
        HistoryStep(shots[0], dialect.parse(ask), ask, "The blue one\nplease"),
        HistoryStep(shots[1], dialect.parse(QWEN_ACTION), QWEN_ACTION),
    ]
    config = default_prompt_config("qwen3_vl", variant="mobile_use_mobileworld", history_images=2)
    messages, images = render_messages(TASK, history, shots[2], config)
    assert images == [shots[1], shots[2]]
    content = messages[1]["content"]
    assert [p["type"] for p in content] == ["text", "image_url", "image_url"]
    assert content[0]["text"].startswith(f"\nThe user query: {TASK.instruction}\nTask progress")
    assert (
        "Ask user response: The blue oneplease; Step 2: I tapped on the search bar.; \n"
        in (content[0]["text"])
    )


def test_render_is_deterministic(make_prepared) -> None:
    shots = [make_prepared(shade=i) for i in range(3)]
    history = [_mai_step(OPEN, shots[0]), _mai_step(CLICK, shots[1])]
    config = default_prompt_config("mai_ui")
    assert render_messages(TASK, history, shots[2], config) == render_messages(
        TASK, history, shots[2], config
    )


def test_mai_ui_grounding_is_one_step_like_the_grounding_agent(make_prepared) -> None:
    """``MAIGroundingAgent._build_messages``: system; user(instruction + "\\n", screenshot)."""
    config = default_prompt_config("mai_ui", variant="grounding")
    current = make_prepared()
    history = [_mai_step(CLICK, make_prepared(shade=1))]
    messages, images = render_messages(TASK, history, current, config)
    assert images == [current]
    assert [m["role"] for m in messages] == ["system", "user"]
    text, image = messages[1]["content"]
    assert text == {"type": "text", "text": TASK.instruction + "\n"}
    assert image["type"] == "image_url"
    assert messages[0]["content"][0]["text"].startswith("You are a GUI grounding agent.")
