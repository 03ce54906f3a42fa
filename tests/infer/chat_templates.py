"""chat_templates.py - chat templates of public Hugging Face models (as their
tokenizer_config.json ship them) and conversations, for the chat-template
tests: loom's engine must render what transformers' apply_chat_template
renders."""

CHATML = ("{% for message in messages %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}"
          "{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")

TEMPLATES = {
    # transformers' ChatML default (before 4.43) - loom's default too
    "chatml": CHATML,
    # GPT-2's default_chat_template in transformers 4.40
    "gpt2": "{% for message in messages %}{{ message.content }}{{ eos_token }}{% endfor %}",
    # Qwen-style ChatML with a default system message
    "qwen": ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
             "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
             "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
             "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    # HuggingFaceH4/zephyr-7b-beta (trim_blocks / lstrip_blocks at work)
    "zephyr": ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content']"
               " + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + "
               "eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + "
               "eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n"
               "{% endif %}\n{% endfor %}"),
    # meta-llama/Llama-2-7b-chat-hf
    "llama2": ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
               "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
               "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0)"
               " %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
               "{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
               "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
               "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
               "content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + "
               "' ' + eos_token }}{% endif %}{% endfor %}"),
    # mistralai/Mixtral-8x7B-Instruct-v0.1
    "mixtral": ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0)"
                " %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
                "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
                "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"),
    # meta-llama/Meta-Llama-3-8B-Instruct
    "llama3": ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
               "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
               "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
               "{{ content }}{% endfor %}{% if add_generation_prompt %}"
               "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    # more of Jinja: namespace, whitespace control, filters, tests, loop filter, slices, dicts
    "syntax": ("{%- set ns = namespace(found=false, n=0) -%}\n"
               "{%- for message in messages if message.content is not none -%}\n"
               "    {%- if message['role'] == 'system' -%}{%- set ns.found = true -%}{%- endif -%}\n"
               "    {%- set ns.n = ns.n + 1 -%}\n"
               "{%- endfor -%}\n"
               "{%- if not ns.found -%}\n{{- 'System: default (' ~ ns.n ~ ' messages)\\n' -}}\n{%- endif %}\n"
               "{% for message in messages %}\n"
               "    {% if message.role == 'system' %}System: {{ message.content }}\n"
               "    {% elif message.role == 'user' %}User: {{ message.content | upper }} [{{ loop.index }}/"
               "{{ loop.length }}]\n"
               "    {% else %}Assistant: {{ message['content'] ~ '!' }}{{ ' (last)' if loop.last else '' }}\n"
               "    {% endif %}\n"
               "{% endfor %}\n"
               "{% set d = {'a': 1, 'b': [2, 3]} %}{{ d['b'][-1] }}{{ d.a * 4 // 3 }}{{ (messages | length) % 2 }}"
               "{{ messages[-1].content[:3] }}{{ 'x' in 'xyz' }}{{ messages[0].get('name', 'anon') }}"
               "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ [1, 2] | join('-') }}"
               "{% if add_generation_prompt %}Assistant:{% endif %}"),
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "  Tell me a joke.  "}],
    [{"role": "user", "content": "\u00e9t\u00e9 \U0001f600\n multi\nline "}, {"role": "assistant", "content": "ok"},
     {"role": "user", "content": "again"}],
    [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],  # breaks alternation
    [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
]
