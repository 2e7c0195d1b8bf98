# From Tongyi-MAI/MobileWorld (https://github.com/Tongyi-MAI/MobileWorld), licensed under the
# Apache License, Version 2.0 (the repository's LICENSE; the source files carry no header).
# You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

# Vendored for cua_native's differential parser tests only (never imported by the package).
# Source: Tongyi-MAI/MobileWorld @ 6a4dec2d1b81eae143438096f51df27a42d34faf (LICENSE: Apache-2.0)
#   src/mobile_world/agents/implementations/qwen3vl.py: SCALE_FACTOR, parse_tagged_text,
#     parse_action_to_structure_output, parsing_response_to_andoid_world_env_action
#   src/mobile_world/agents/utils/agent_mapping.py: QWENVL2AW_ACTION_MAP
#   src/mobile_world/runtime/utils/models.py: the action type constants the map uses
# Changes: the pieces are put in one module with only the imports they use; loguru's `logger`
# (not installed here) is replaced by a standard-library logger. Function bodies, the map and the
# constants are byte-identical to upstream.
# ruff: noqa

import json
import logging

logger = logging.getLogger(__name__)

# src/mobile_world/runtime/utils/models.py
ANSWER = "answer"
CLICK = "click"
DOUBLE_TAP = "double_tap"
FINISHED = "finished"
INPUT_TEXT = "input_text"
KEYBOARD_ENTER = "keyboard_enter"
LONG_PRESS = "long_press"
NAVIGATE_BACK = "navigate_back"
NAVIGATE_HOME = "navigate_home"
OPEN_APP = "open_app"
SCROLL = "scroll"
STATUS = "status"
SWIPE = "swipe"
UNKNOWN = "unknown"
WAIT = "wait"
DRAG = "drag"
ASK_USER = "ask_user"

# src/mobile_world/agents/utils/agent_mapping.py
QWENVL2AW_ACTION_MAP = {
    "click": CLICK,
    "type": INPUT_TEXT,
    "long_press": LONG_PRESS,
    "scroll": SCROLL,
    "back": NAVIGATE_BACK,
    "home": NAVIGATE_HOME,
    "enter": KEYBOARD_ENTER,
    "answer": ANSWER,
    "open_app": OPEN_APP,
    "wait": WAIT,
    "terminate": FINISHED,
    "swipe": DRAG,
    "ask_user": ASK_USER,
    "drag": DRAG,
}

# src/mobile_world/agents/implementations/qwen3vl.py
SCALE_FACTOR = 999


def parse_tagged_text(text):
    result = {"thinking": None, "conclusion": None, "tool_call": None}

    parts = text.split("Thought:")
    if len(parts) > 1:
        thought_action_part = parts[1]
        action_parts = thought_action_part.split("Action:")

        if len(action_parts) > 1:
            result["thinking"] = action_parts[0].strip()

            action_tool_part = action_parts[1]
            tool_parts = action_tool_part.split("<tool_call>")

            if len(tool_parts) > 1:
                action_content = tool_parts[0].strip()
                if action_content.startswith('"') and action_content.endswith('"'):
                    action_content = action_content[1:-1]
                result["conclusion"] = action_content

                tool_call_content = tool_parts[1].split("</tool_call>")[0].strip()
                try:
                    result["tool_call"] = json.loads(tool_call_content)
                except json.JSONDecodeError as e:
                    raise ValueError(f"Failed to parse tool_call JSON: {e}")

    return result


def parse_action_to_structure_output(text):
    text = text.strip()

    results = parse_tagged_text(text)
    thinking = results["thinking"]
    tool_call = results["tool_call"]
    conclusion = results["conclusion"]
    action = tool_call["arguments"]
    action_name = tool_call["name"]

    if "coordinate" in action:
        coordinates = action["coordinate"]
        if len(coordinates) == 2:
            point_x, point_y = coordinates
        elif len(coordinates) == 4:
            x1, y1, x2, y2 = coordinates
            point_x = (x1 + x2) / 2
            point_y = (y1 + y2) / 2
        else:
            raise ValueError("Wrong output format")
        point_x = point_x / SCALE_FACTOR
        point_y = point_y / SCALE_FACTOR
        action["coordinate"] = [point_x, point_y]

    if "coordinate2" in action:
        coordinates = action["coordinate2"]
        if len(coordinates) == 2:
            point_x, point_y = coordinates
        elif len(coordinates) == 4:
            x1, y1, x2, y2 = coordinates
            point_x = (x1 + x2) / 2
            point_y = (y1 + y2) / 2
        else:
            raise ValueError("Wrong output format")
        point_x = point_x / SCALE_FACTOR
        point_y = point_y / SCALE_FACTOR
        action["coordinate2"] = [point_x, point_y]

    return {
        "thinking": thinking,
        "action_json": action,
        "conclusion": conclusion,
        "action_name": action_name,
    }


def parsing_response_to_andoid_world_env_action(
    structured_response, image_height: int, image_width: int
) -> dict:
    action_json = structured_response.get("action_json")
    action_type = action_json.get("action")

    result = {}

    if action_type == "type":
        result = {
            "action_type": QWENVL2AW_ACTION_MAP["type"],
            "text": action_json.get("text", ""),
        }

    elif action_type in ["swipe"]:
        start_box = action_json.get("coordinate")
        end_box = action_json.get("coordinate2")
        if start_box and end_box:
            (
                x1,
                y1,
            ) = start_box
            (
                x2,
                y2,
            ) = end_box

            result = {
                "action_type": QWENVL2AW_ACTION_MAP["swipe"],
                "start_x": round(float(x1) * image_width),
                "start_y": round(float(y1) * image_height),
                "end_x": round(float(x2) * image_width),
                "end_y": round(float(y2) * image_height),
            }
        else:
            raise ValueError("Invalid scroll box format")

    elif action_type in ["click", "long_press"]:
        start_box = action_json.get("coordinate")
        if start_box:
            try:
                if len(start_box) == 4:
                    x1, y1, x2, y2 = start_box
                elif len(start_box) == 2:
                    x1, y1 = start_box
                    x2, y2 = x1, y1
                else:
                    raise ValueError(f"Invalid box format: {start_box}")

                # Calculate center coordinates
                x = round(float((x1 + x2) / 2) * image_width)
                y = round(float((y1 + y2) / 2) * image_height)
                result = {"action_type": QWENVL2AW_ACTION_MAP[action_type], "x": x, "y": y}
            except Exception as e:
                logger.error(f"Error parsing coordinates from start_box: {e}")
        else:
            raise ValueError(f"Invalid action_type: {action_type}")
    elif action_type in ["system_button"]:
        button = action_json.get("button")
        if button == "Home":
            result = {"action_type": QWENVL2AW_ACTION_MAP["home"]}
        elif button == "Back":
            result = {"action_type": QWENVL2AW_ACTION_MAP["back"]}
        elif button == "Enter":
            result = {"action_type": QWENVL2AW_ACTION_MAP["enter"]}
        else:
            raise ValueError(f"Unsupported button: {button}")
    elif action_type in ["ask_user"]:
        result = {
            "action_type": QWENVL2AW_ACTION_MAP["ask_user"],
            "text": action_json.get("text", ""),
        }
    elif (
        action_type == "open"
    ):  # qwen3 prompt does not support open_app action, only keep for compatibility
        result = {"action_type": "open_app", "app_name": action_json.get("text", "")}

    elif action_type == "terminate":
        status = action_json.get("status", "")
        result = {"action_type": QWENVL2AW_ACTION_MAP["terminate"], "text": status}
    elif action_type == "answer":
        answer_text = action_json.get("text", "")
        result = {"action_type": QWENVL2AW_ACTION_MAP["answer"], "text": answer_text}
    elif action_type == "wait":
        result = {
            "action_type": QWENVL2AW_ACTION_MAP["wait"],
        }

    return result
