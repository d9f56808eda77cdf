"""families.py: chat templates in the style of twelve model families' public model cards,
written for these tests (none is a copy of a published template: the prompts' shapes and
special tokens follow the families, the Jinja is ours), each with the template variables that
family's cards pass (FAMILY_VARS), and the conversations tests/jinja/jinjacmp.py renders them
over (conversations(): system prompts, multi-turn, Unicode that case mapping changes, tools,
assistant tool calls with arguments as objects or JSON strings, tool results, reasoning,
documents).  A family whose cards refuse some conversations (roles that do not alternate)
does so with raise_exception, and the comparison checks the message too."""
import json
import random
import zlib

# ---- Llama 3.1: tools as JSON in the first user turn, built-in tools named in the system turn
LLAMA31 = r"""{{- bos_token }}
{%- set custom = custom_tools if custom_tools is defined else tools %}
{%- set put_tools_in_user = tools_in_user_message if tools_in_user_message is defined else true %}
{%- set today = date_string if date_string is defined else "26 Jul 2024" %}
{%- if messages and messages[0].role == 'system' %}
    {%- set sys_text = messages[0].content | trim %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set sys_text = "" %}
    {%- set rest = messages %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or custom is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {%- set named = builtin_tools | reject('equalto', 'code_interpreter') | list %}
    {%- if named %}
        {{- "Tools: " ~ named | join(", ") ~ "\n\n" }}
    {%- endif %}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\nToday Date: " ~ today ~ "\n\n" }}
{%- if custom is not none and not put_tools_in_user %}
    {{- "You may call these functions. Answer a call as JSON: {\"name\": name, \"parameters\": {argument: value}}.\n\n" }}
    {%- for t in custom %}
        {{- t | tojson(indent=4) ~ "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- sys_text ~ "<|eot_id|>" }}
{%- if custom is not none and put_tools_in_user %}
    {%- if not rest %}
        {{- raise_exception("Tools go into the first user message, and there is none.") }}
    {%- endif %}
    {%- set first_user = rest[0].content | trim %}
    {%- set rest = rest[1:] %}
    {{- "<|start_header_id|>user<|end_header_id|>\n\n" }}
    {{- "Given the functions below, answer the prompt with a function call as JSON of the form {\"name\": function name, \"parameters\": {argument: value}}. Use no variables.\n\n" }}
    {%- for t in custom %}
        {{- t | tojson(indent=4) ~ "\n\n" }}
    {%- endfor %}
    {{- first_user ~ "<|eot_id|>" }}
{%- endif %}
{%- for m in rest %}
    {%- if m.role in ['ipython', 'tool'] %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if m.content is mapping or m.content is iterable and m.content is not string %}
            {{- m.content | tojson }}
        {%- else %}
            {{- m.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- elif m.tool_calls is defined and m.tool_calls %}
        {%- if m.tool_calls | length != 1 %}
            {{- raise_exception("This model takes one tool call a turn.") }}
        {%- endif %}
        {%- set call = m.tool_calls[0].function %}
        {{- "<|start_header_id|>assistant<|end_header_id|>\n\n" }}
        {%- if builtin_tools is defined and call.name in builtin_tools %}
            {{- "<|python_tag|>" ~ call.name ~ ".call(" }}
            {%- for name, val in call.arguments | items %}
                {{- name ~ '="' ~ val ~ '"' }}{{ ", " if not loop.last }}
            {%- endfor %}
            {{- ")" }}
        {%- else %}
            {{- '{"name": "' ~ call.name ~ '", "parameters": ' }}
            {{- call.arguments | tojson if call.arguments is mapping else call.arguments }}
            {{- "}" }}
        {%- endif %}
        {{- "<|eom_id|>" if builtin_tools is defined else "<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>" ~ m.role ~ "<|end_header_id|>\n\n" ~ m.content | trim ~ "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- "<|start_header_id|>assistant<|end_header_id|>\n\n" }}
{%- endif %}"""

# ---- Llama 3.2: today's date from strftime_now, tools in the system turn by choice
LLAMA32 = r"""{{- bos_token }}
{%- if date_string is not defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(system="", tools_where="user" if tools_in_user_message is not defined or tools_in_user_message else "system") %}
{%- set turns = messages %}
{%- if messages and messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set turns = messages[1:] %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools %}{{ "Environment: ipython\n" }}{% endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: %s\n\n" % date_string }}
{%- if tools and ns.tools_where == "system" %}
    {{- "Functions you may call, as JSON {\"name\": ..., \"parameters\": ...}:\n\n" }}
    {%- for t in tools %}{{ t | tojson(indent=4) }}{{ "\n\n" }}{% endfor %}
{%- endif %}
{{- ns.system }}{{ "<|eot_id|>" }}
{%- for m in turns %}
    {%- set first_user = loop.first and m.role == 'user' %}
    {%- if m.role == 'assistant' and m.tool_calls %}
        {{- "<|start_header_id|>assistant<|end_header_id|>\n\n" }}
        {%- for tc in m.tool_calls %}
            {%- set f = tc.function if tc.function is defined else tc %}
            {{- {"name": f.name, "parameters": f.arguments if f.arguments is mapping else f.arguments | string} | tojson }}
            {%- if not loop.last %}{{ "; " }}{% endif %}
        {%- endfor %}
        {{- "<|eot_id|>" }}
    {%- elif m.role == 'tool' %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" ~ m.content ~ "<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>" ~ m.role ~ "<|end_header_id|>\n\n" }}
        {%- if first_user and tools and ns.tools_where == "user" %}
            {{- "Answer with a function call if one helps.\n\n" }}
            {%- for t in tools %}{{ t | tojson(indent=4) }}{{ "\n\n" }}{% endfor %}
        {%- endif %}
        {{- m.content | trim }}{{ "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ "<|start_header_id|>assistant<|end_header_id|>\n\n" }}{% endif %}"""

# ---- Qwen 2.5: ChatML, tools in <tools>, calls in <tool_call>, tool results folded into a user turn
QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {{- messages[0].content if messages[0].role == 'system' else 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nFunction signatures are inside <tools></tools>:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" ~ tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each call, return a JSON object with the name and arguments inside <tool_call></tool_call>:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {{- '<|im_start|>system\n' ~ (messages[0].content if messages[0].role == 'system' else 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.') ~ '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' ~ message.role ~ '\n' ~ message.content ~ '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' ~ message.role }}
        {%- if message.content %}
            {{- '\n' ~ message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}{{ tool_call.name }}{{ '", "arguments": ' }}
            {{- tool_call.arguments if tool_call.arguments is string else tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' ~ message.content ~ '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""

# ---- Qwen 3: thinking on / off (enable_thinking), reasoning kept only after the last user query
QWEN3 = r"""{%- macro text_of(c) -%}
    {%- if c is string -%}{{ c }}
    {%- elif c is iterable and c is not mapping -%}
        {%- for part in c if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}{{- text_of(messages[0].content) + '\n\n' }}{%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>" }}
    {%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + text_of(messages[0].content) + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- set body = text_of(message.content) %}
    {%- if ns.multi_step_tool and message.role == "user" and not (body.startswith('<tool_response>') and body.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = text_of(message.content) %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}{{- '\n' }}{%- endif %}
                {%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
                {{- '<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\n<tool_response>\n' }}{{- content }}{{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""

# ---- Mistral / Mixtral: [INST] turns that must alternate, tools before the last user turn,
# [TOOL_CALLS] with 9-character ids, [TOOL_RESULTS]
MISTRAL = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{%- set ns = namespace(index=0) %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}{{- '"' + key + '": "' + val + '"' }}{%- else %}{{- '"' + key + '": ' + val|tojson }}{%- endif %}
                    {%- if not loop.last %}{{- ", " }}{%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" }}{%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function | tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id | length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" + eos_token }}{%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"] | trim + eos_token }}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content | string | tojson + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id | length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}"""

# ---- DeepSeek V3 / R1: full-width bar tokens, tool calls in a fenced JSON block, the thinking
# of earlier answers dropped
DEEPSEEK = r"""{%- if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}
{%- set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}
{%- for message in messages if message['role'] == 'system' %}
    {%- if ns.is_first_sp %}
        {%- set ns.system_prompt = ns.system_prompt + message['content'] %}
        {%- set ns.is_first_sp = false %}
    {%- else %}
        {%- set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}{{ ns.system_prompt }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {%- set ns.is_tool = false %}
        {{- '<｜User｜>' + message['content'] }}
    {%- elif message['role'] == 'assistant' and message['tool_calls'] %}
        {%- set ns.is_tool = false %}
        {%- for tool in message['tool_calls'] %}
            {%- set args = tool['function']['arguments'] if tool['function']['arguments'] is string else tool['function']['arguments'] | tojson %}
            {%- if not ns.is_first %}
                {%- if message['content'] %}
                    {{- '<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] | default('function') + '<｜tool▁sep｜>' + tool['function']['name'] + '\n```json\n' + args + '\n```<｜tool▁call▁end｜>' }}
                {%- else %}
                    {{- '<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] | default('function') + '<｜tool▁sep｜>' + tool['function']['name'] + '\n```json\n' + args + '\n```<｜tool▁call▁end｜>' }}
                {%- endif %}
                {%- set ns.is_first = true %}
            {%- else %}
                {{- '\n<｜tool▁call▁begin｜>' + tool['type'] | default('function') + '<｜tool▁sep｜>' + tool['function']['name'] + '\n```json\n' + args + '\n```<｜tool▁call▁end｜>' }}
            {%- endif %}
        {%- endfor %}
        {{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}
        {%- set ns.is_first = false %}
    {%- elif message['role'] == 'assistant' %}
        {%- set content = message['content'] %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1] %}
        {%- endif %}
        {%- if ns.is_tool %}
            {{- '<｜tool▁outputs▁end｜>' + content + '<｜end▁of▁sentence｜>' }}
            {%- set ns.is_tool = false %}
        {%- else %}
            {{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}
        {%- endif %}
    {%- elif message['role'] == 'tool' %}
        {%- set ns.is_tool = true %}
        {%- if ns.is_output_first %}
            {{- '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
            {%- set ns.is_output_first = false %}
        {%- else %}
            {{- '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
        {%- endif %}
    {%- endif %}
    {%- if message['role'] != 'tool' %}{%- set ns.is_output_first = true %}{%- endif %}
{%- endfor %}
{%- if ns.is_tool %}{{- '<｜tool▁outputs▁end｜>' }}{%- endif %}
{%- if add_generation_prompt and not ns.is_tool %}{{- '<｜Assistant｜><think>\n' }}{%- endif %}"""

# ---- Gemma 2 / 3: user and model turns, the system text in front of the first user turn
GEMMA = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}"""

# ---- Phi 3 / 4: <|system|> <|user|> <|assistant|> ... <|end|>, tools as a JSON list in the
# system turn, a speaker's name capitalized
PHI = r"""{%- set sys = messages | selectattr('role', 'equalto', 'system') | map(attribute='content') | list -%}
{%- if sys or tools -%}
<|system|>
{{ sys | join('\n') }}
{%- if tools %}
<|tool|>{{ tools | map(attribute='function') | list | tojson }}<|/tool|>
{%- endif %}<|end|>
{% endif -%}
{%- for message in messages if message.role != 'system' -%}
    {%- if message.role == 'tool' -%}
<|tool_response|>{{ message.content }}<|end|>
{% elif message.role == 'assistant' and message.tool_calls -%}
<|assistant|><|tool_call|>{{ message.tool_calls | map(attribute='function') | list | tojson }}<|/tool_call|><|end|>
{% else -%}
<|{{ message.role }}|>
{% if message.name is defined and message.name %}{{ message.name | capitalize }}: {% endif %}{{ message.content }}<|end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|assistant|>
{% else -%}
{{ eos_token }}
{%- endif -%}"""

# ---- Command R: documents and tools as Python signatures in the system turn, role tokens in upper case
COMMAND_R = r'''{%- macro json_to_python_type(json_spec) -%}
{%- set basic_type_map = {"string": "str", "number": "float", "integer": "int", "boolean": "bool"} -%}
{%- if json_spec.type in basic_type_map -%}{{- basic_type_map[json_spec.type] -}}
{%- elif json_spec.type == "array" -%}{{- "List[" + json_to_python_type(json_spec['items']) + "]" -}}
{%- elif json_spec.type == "object" -%}{{- "Dict[str, Any]" -}}
{%- elif json_spec.type is iterable and json_spec.type is not string -%}{{- "Union[" -}}{%- for t in json_spec.type -%}{{- json_to_python_type({"type": t}) -}}{{- ", " if not loop.last -}}{%- endfor -%}{{- "]" -}}
{%- else -%}{{- "Any" -}}
{%- endif -%}
{%- endmacro -%}
{%- macro turn(role, text) -%}
<|START_OF_TURN_TOKEN|><|{{ role | upper }}_TOKEN|>{{ text }}<|END_OF_TURN_TOKEN|>
{%- endmacro -%}
{{ bos_token }}
{%- set preamble = messages[0].content if messages[0].role == 'system' else "You are Command, a brilliant, sophisticated, AI-assistant trained to assist human users by providing thorough responses." -%}
{%- set sys_text -%}
# Safety Preamble
The instructions in this section override those in the task description and style guide sections. Don't answer questions that are harmful or immoral.

# System Preamble
## Basic Rules
You are a powerful conversational AI trained by Cohere to help people.

# User Preamble
{{ preamble }}
{%- if tools %}

## Available Tools
Here is a list of tools that you have available to you:
{% for tool in tools %}
{%- set f = tool.function %}
```python
def {{ f.name }}({% for name, spec in (f.parameters.properties | default({})) | dictsort %}{{ name }}: {{ json_to_python_type(spec) }}{{ ", " if not loop.last }}{% endfor %}) -> List[Dict]:
    """{{ f.description | default('') | trim }}
{% if f.parameters is defined and f.parameters.properties %}
    Args:
{% for name, spec in f.parameters.properties | dictsort %}
        {{ name }} ({{ json_to_python_type(spec) }}): {{ spec.description | default(name | title) }}
{% endfor %}
{% endif %}
    """
    pass
```
{% endfor %}
{%- endif %}
{%- endset -%}
{{ turn('system', sys_text) }}
{%- for message in messages if message.role != 'system' -%}
    {%- if message.role == 'tool' -%}
        {{ turn('system', '<results>\n' ~ message.content ~ '\n</results>') }}
    {%- elif message.role == 'assistant' and message.tool_calls -%}
        {%- set acc = namespace(calls=[]) -%}
        {%- for c in message.tool_calls -%}
            {%- set acc.calls = acc.calls + [{"tool_name": c.function.name, "parameters": c.function.arguments}] -%}
        {%- endfor -%}
        {{ turn('chatbot', 'Action: ```json\n' ~ acc.calls | tojson(indent=4) ~ '\n```') }}
    {%- else -%}
        {{ turn('user' if message.role == 'user' else 'chatbot', message.content) }}
    {%- endif -%}
{%- endfor -%}
{%- if documents -%}
    {%- set docs -%}
<results>
{% for d in documents %}
Document: {{ loop.index0 }}
title: {{ d.title | default('Untitled') | title }}
text: {{ d.text }}
{% endfor %}
</results>
    {%- endset -%}
    {{ turn('system', docs) }}
    {{- turn('system', "Carefully perform the following instructions, in order, starting each with a new line.\nFirstly, Decide which of the retrieved documents are relevant to the user's last input by writing 'Relevant Documents:' followed by comma-separated list of document numbers. If none are relevant, you should instead write 'None'.") }}
{%- endif -%}
{%- if add_generation_prompt -%}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{%- endif -%}'''

# ---- Granite 3: roles in <|start_of_role|>, tools and documents as their own turns, the date
# from strftime_now, thinking on request
GRANITE = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = "Knowledge Cutoff Date: April 2024.\nToday's Date: " + strftime_now('%B %d, %Y') + ".\nYou are Granite, developed by IBM." %}
    {%- if tools and documents %}
        {%- set system_message = system_message + " You are a helpful AI assistant with access to the following tools. When a tool is required to answer the user's query, respond with <|tool_call|> followed by a JSON list of tools used. If a tool does not exist in the provided list of tools, notify the user that you do not have the ability to fulfill the request.\n\nWrite the response to the user's input by strictly aligning with the facts in the provided documents. If the information needed to answer the question is not available in the documents, inform the user that the question cannot be answered based on the available data." %}
    {%- elif tools %}
        {%- set system_message = system_message + " You are a helpful AI assistant with access to the following tools. When a tool is required to answer the user's query, respond with <|tool_call|> followed by a JSON list of tools used." %}
    {%- elif documents %}
        {%- set system_message = system_message + " Write the response to the user's input by strictly aligning with the facts in the provided documents." %}
    {%- elif thinking is defined and thinking %}
        {%- set system_message = system_message + " You are a helpful AI assistant.\nRespond to every user query in a comprehensive and detailed way. You can write down your thoughts and reasoning process before responding. In the thought process, engage in a comprehensive cycle of analysis, summarization, exploration, reassessment, reflection, backtracing, and iteration to develop well-considered thinking process. In the response section, based on various attempts, explorations, and reflections from the thoughts section, systematically present the final solution that you deem correct. The response should summarize the thought process. Write your thoughts after 'Here is my thought process:' and write your response after 'Here is my response:' for each user query." %}
    {%- else %}
        {%- set system_message = system_message + " You are a helpful AI assistant." %}
    {%- endif %}
    {%- if 'citations' in controls | default({}) and documents %}
        {%- set system_message = system_message + '\n\nIn your response, use the symbols <co> and </co> to indicate when a fact comes from a document in the search result, e.g <co>0</co> for a fact from document 0.' %}
    {%- endif %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\n' }}
{%- if tools %}
    {{- '<|start_of_role|>tools<|end_of_role|>' }}
    {{- tools | tojson(indent=4) }}
    {{- '<|end_of_text|>\n' }}
{%- endif %}
{%- if documents %}
    {%- for document in documents %}
        {{- '<|start_of_role|>document {"document_id": "' + document['doc_id'] | default(loop.index0 | string) + '"}<|end_of_role|>\n' }}
        {{- document['text'] }}
        {{- '<|end_of_text|>\n' }}
    {%- endfor %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message['role'] == 'assistant' and message.tool_calls %}
        {{- '<|start_of_role|>assistant<|end_of_role|><|tool_call|>' + message.tool_calls | map(attribute='function') | list | tojson + '<|end_of_text|>\n' }}
    {%- elif message['role'] == 'tool' %}
        {{- '<|start_of_role|>tool_response<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}
    {%- else %}
        {{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}
    {%- endif %}
    {%- if loop.last and add_generation_prompt %}
        {{- '<|start_of_role|>assistant' }}
        {%- if controls %}{{- ' ' + controls | tojson }}{%- endif %}
        {{- '<|end_of_role|>' }}
    {%- endif %}
{%- endfor %}"""

# ---- gpt-oss-style channels: a system turn with the date and reasoning effort, a developer
# turn with the tools as TypeScript declarations (a recursive macro), analysis / final
# channels, calls addressed to functions.NAME
HARMONY = r"""{%- macro ts_type(p) -%}
    {%- if p.type is not defined -%}any
    {%- elif p.type == "string" -%}
        {%- if p.enum is defined -%}{%- for v in p.enum -%}"{{ v }}"{{ " | " if not loop.last }}{%- endfor -%}{%- else -%}string{%- endif -%}
    {%- elif p.type in ["number", "integer"] -%}number
    {%- elif p.type == "boolean" -%}boolean
    {%- elif p.type == "array" -%}{{ ts_type(p['items']) if p['items'] is defined else "any" }}[]
    {%- elif p.type == "object" -%}
        {%- if p.properties is defined -%}{ {% for k, v in p.properties.items() %}{{ k }}{{ "?" if k not in p.required | default([]) }}: {{ ts_type(v) }}{{ ", " if not loop.last }}{% endfor %} }{%- else -%}Record<string, any>{%- endif -%}
    {%- else -%}any
    {%- endif -%}
{%- endmacro -%}
{%- macro render_tools(tools) -%}
namespace functions {
{% for t in tools %}
{%- set f = t.function %}

// {{ f.description | default('') | replace('\n', '\n// ') }}
type {{ f.name }} = {% if f.parameters is defined and f.parameters.properties %}(_: {
{%- for name, p in f.parameters.properties.items() %}

{% if p.description is defined %}// {{ p.description }}
{% endif %}{{ name }}{{ "?" if name not in f.parameters.required | default([]) }}: {{ ts_type(p) }},
{%- if p.default is defined %} // default: {{ p.default | tojson }}{% endif %}
{%- endfor %}

}) => any;{% else %}() => any;{% endif %}

{%- endfor %}

} // namespace functions
{%- endmacro -%}
<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Knowledge cutoff: 2024-06
Current date: {{ strftime_now("%Y-%m-%d") }}

Reasoning: {{ reasoning_effort | default("medium") }}

# Valid channels: analysis, commentary, final. Channel must be included for every message.
{%- if tools %}

Calls to these tools must go to the commentary channel: 'functions'.
{%- endif %}<|end|>
{%- set dev = messages | selectattr('role', 'in', ['system', 'developer']) | map(attribute='content') | join('\n') %}
{%- if dev or tools %}<|start|>developer<|message|>
{%- if dev %}# Instructions

{{ dev }}

{% endif %}
{%- if tools %}# Tools

## functions

{{ render_tools(tools) }}
{%- endif %}<|end|>
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages if m.role == 'user' %}{% set ns.last_user = loop.index %}{% endfor %}
{%- set convo = messages | rejectattr('role', 'in', ['system', 'developer']) | list %}
{%- set ns2 = namespace(users=0) %}
{%- for m in convo %}
    {%- if m.role == 'user' %}
        {%- set ns2.users = ns2.users + 1 %}
<|start|>user<|message|>{{ m.content }}<|end|>
    {%- elif m.role == 'assistant' %}
        {%- set thinking = m.reasoning_content | default(m.thinking | default('')) %}
        {%- if m.tool_calls %}
            {%- if thinking and ns2.users == ns.last_user %}<|start|>assistant<|channel|>analysis<|message|>{{ thinking }}<|end|>{% endif %}
            {%- for tc in m.tool_calls %}
<|start|>assistant to=functions.{{ tc.function.name }}<|channel|>commentary json<|message|>{{ tc.function.arguments if tc.function.arguments is string else tc.function.arguments | tojson }}<|call|>
            {%- endfor %}
        {%- else %}
            {%- if thinking and loop.last and not add_generation_prompt %}<|start|>assistant<|channel|>analysis<|message|>{{ thinking }}<|end|>{% endif %}
<|start|>assistant<|channel|>final<|message|>{{ m.content }}{{ "<|return|>" if loop.last and not add_generation_prompt else "<|end|>" }}
        {%- endif %}
    {%- elif m.role == 'tool' %}
        {%- set ns3 = namespace(name=m.name | default('unknown')) %}
        {%- for prev in convo[:loop.index0] | reverse if prev.tool_calls and ns3.name == 'unknown' %}
            {%- set ns3.name = prev.tool_calls[-1].function.name %}
        {%- endfor %}
<|start|>functions.{{ ns3.name }} to=assistant<|channel|>commentary<|message|>{{ m.content | tojson }}<|end|>
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""

# ---- ChatML: the plain form, with each role's name in the header when given (lower case) and
# the assistant's text in transformers' generation tag
CHATML = r"""{%- for message in messages %}
{{- '<|im_start|>' + message['role'] }}
{%- if message.name is defined and message.name %}{{ ' name=' ~ message.name | lower | replace(' ', '_') }}{% endif %}
{{- '\n' }}
{%- if message.role == 'assistant' %}
{%- generation %}{% set shown = message['content'] %}{{ shown + '<|im_end|>' }}{% endgeneration %}
{%- else %}
{{- message['content'] + '<|im_end|>' }}
{%- endif %}
{{- '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}"""

FAMILIES = {"llama31": LLAMA31, "llama32": LLAMA32, "qwen25": QWEN25, "qwen3": QWEN3, "mistral_tools": MISTRAL,
            "deepseek": DEEPSEEK, "gemma": GEMMA, "phi": PHI, "command_r": COMMAND_R, "granite": GRANITE,
            "harmony": HARMONY, "chatml_names": CHATML}

# ---- the conversations ------------------------------------------------------------------------------

TEXTS = ["Hi there", "What is 2+2?", "  padded with spaces  ", "line one\nline two\n", "ünïcödé ✓ 日本語",
         "Straße, ÄÖÜ and ΟΔΟΣ: Unicode case", "İstanbul'da ǆemal ﬁndet ŉ", "quotes ' and \" and \\ backslash",
         "tabs\tand\r\nCRLF", "emoji 😀👍🏽 and العربية", "{{ not a template }} {% neither %}", "Σίσυφος ΣΑΣ.",
         "a much longer message that goes on for a while, with punctuation; and more.", "<tool_response>x</tool_response>",
         "Hello <b>world</b> & friends", "\u2028line separator\u0085next line", "x" * 300]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city, now.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "The city, e.g. Zürich"},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_docs", "description": "Söker i dokumenten ✓ \"quoted\"\nsecond line",
                                      "parameters": {"type": "object", "properties": {
                                          "q": {"type": "string"}, "k": {"type": "integer", "minimum": 1},
                                          "tags": {"type": "array", "items": {"type": "string"}},
                                          "filters": {"type": "object", "properties": {"year": {"type": "integer"},
                                                                                       "lang": {"type": ["string", "null"]}}}},
                                          "required": ["q"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "calc", "description": "Exact arithmetic.",
                                      "parameters": {"type": "object", "properties": {"expr": {"type": "string"},
                                                                                      "precision": {"type": "number"},
                                                                                      "exact": {"type": "boolean"}},
                                                     "required": ["expr", "exact"]}}},
]

DOCUMENTS = [{"title": "the tale of ÄSOP", "text": "Fables ü ß and morals."},
             {"title": "ΟΔΟΙΠΟΡΙΚΌ", "text": "A Greek travelogue.", "doc_id": "g-7"},
             {"text": "An untitled note with \"quotes\"."}]


def _args(rng, name):
    pool = {"get_weather": {"city": rng.choice(["Zürich", "São Paulo", "東京", "Oslo"]), "unit": rng.choice(["celsius", "fahrenheit"])},
            "search_docs": {"q": rng.choice(TEXTS[:8]), "k": rng.randint(1, 9), "tags": ["a", "ß"], "filters": {"year": 2024, "lang": None}},
            "now": {}, "calc": {"expr": "2**10 / 3", "precision": 0.5, "exact": rng.random() < 0.5}}
    return pool[name]


def conversations(rng, n, alternate=False, call_ids9=False, single_call=False, no_tools=False):
    """n variable sets: messages (+ tools, documents, add_generation_prompt, special tokens).
    alternate: user / assistant turns alternate; call_ids9: tool call ids of 9 characters
    (Mistral's rule); single_call: one call a turn; no_tools: none at all."""
    out = []
    for i in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": rng.choice(TEXTS)})
        tools = rng.sample(TOOLS, rng.randint(1, len(TOOLS))) if rng.random() < 0.6 and not no_tools else None
        for turn in range(rng.randint(1, 4)):
            user = {"role": "user", "content": rng.choice(TEXTS)}
            if rng.random() < 0.15:
                user["name"] = rng.choice(["ÄNNE müller", "Bob", "élodie"])
            msgs.append(user)
            if tools and rng.random() < 0.5:
                calls = []
                for c in range(1 if single_call else rng.randint(1, 2)):
                    name = rng.choice(tools)["function"]["name"]
                    args = _args(rng, name)
                    cid = ("c%08d" % rng.randint(0, 10**8 - 1)) if call_ids9 else "call_%d_%d_%d" % (i, turn, c)
                    fn = {"name": name, "arguments": args if rng.random() < 0.8 else json.dumps(args, ensure_ascii=False)}
                    calls.append({"id": cid, "type": "function", "function": fn})
                asst = {"role": "assistant", "content": rng.choice(["", "Let me check.", "<think>plan it</think>Calling."]),
                        "tool_calls": calls}
                if rng.random() < 0.3:
                    asst["reasoning_content"] = "I should call " + calls[0]["function"]["name"] + " first."
                msgs.append(asst)
                for c in calls:
                    msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                                 "content": rng.choice(['{"temp": 21.5, "sky": "klar"}', "no results", rng.choice(TEXTS)])})
            if rng.random() < 0.8 or alternate:
                a = {"role": "assistant", "content": rng.choice(TEXTS)}
                r = rng.random()
                if r < 0.2:
                    a["content"] = "<think>\nweighing it: ΣΟΦΙΑ\n</think>\n\n" + a["content"]
                elif r < 0.35:
                    a["reasoning_content"] = "Thinking about «" + rng.choice(TEXTS[:6]) + "»."
                msgs.append(a)
        if alternate and msgs[-1]["role"] != "user" and rng.random() < 0.6:
            msgs.append({"role": "user", "content": rng.choice(TEXTS)})
        if rng.random() < 0.1 and not alternate:
            msgs.append({"role": "system", "content": "A late system note."})
        out.append({"messages": msgs, "tools": tools, "add_generation_prompt": rng.random() < 0.7,
                    "bos_token": "<|bos|>", "eos_token": "<|eos|>",
                    "documents": rng.sample(DOCUMENTS, rng.randint(1, 3)) if rng.random() < 0.4 else None})
    return out


def family_cases(name, n=60):
    """The variable sets family name is rendered over: the conversations plus the keyword
    arguments its model cards pass (builtin_tools, enable_thinking, thinking, controls, ...)."""
    rng = random.Random(zlib.crc32(name.encode()))
    cases = conversations(rng, n, alternate=name == "gemma", call_ids9=name == "mistral_tools",
                          single_call=name == "llama31", no_tools=name == "gemma")
    for i, v in enumerate(cases):
        if name == "llama31":
            if i % 3 == 0:
                v["builtin_tools"] = rng.choice([["brave_search", "wolfram_alpha"], ["code_interpreter"], ["code_interpreter", "brave_search"]])
            if i % 4 == 1:
                v["tools_in_user_message"] = False
            if i % 5 == 2:
                v["date_string"] = "01 Jan 2025"
            if v["tools"] and v["messages"][0]["role"] == "system" and len(v["messages"]) == 1:
                v["messages"].append({"role": "user", "content": "Go."})
        elif name == "llama32":
            if i % 3 == 0:
                v["tools_in_user_message"] = False
        elif name == "qwen3":
            if i % 2 == 0:
                v["enable_thinking"] = i % 4 == 0
        elif name == "granite":
            if i % 3 == 0:
                v["thinking"] = True
            if i % 4 == 0:
                v["controls"] = {"citations": True, "length": "short"}
        elif name == "harmony":
            if i % 3 == 0:
                v["reasoning_effort"] = rng.choice(["low", "high"])
        elif name == "deepseek" and i % 7 == 0:
            del v["add_generation_prompt"]
        if name in ("command_r", "granite") and i % 2 == 0 and not v["documents"]:
            v["documents"] = DOCUMENTS[:2]
    return cases
