# A Scrapy spider that crawls through the rotating gateway, as a crawler
# team would run one: one proxy URL for every request, and a report to the
# discovery API when a site rate-limits the session, so the gateway sends
# that site's next requests through another proxy.
#
# scrapy runspider spider.py -a gateway=http://spider-1:TOKEN@127.0.0.1:3128 \
#   -a api=http://127.0.0.1:8090 -a token=TOKEN -a session=spider-1 \
#   -a start=https://127.0.0.81:8443/,https://127.0.0.82:8443/ -a pages=10 -O out.jsonl
import json
import urllib.parse
import urllib.request

import scrapy


class GatewaySpider(scrapy.Spider):
    name = "gateway"
    custom_settings = {
        "CONCURRENT_REQUESTS": 1,  # one at a time: the test knows what came after a report
        # A 429 is the spider's to handle (report, then fetch again); a
        # connection the gateway closed on a report is retried as usual.
        "RETRY_HTTP_CODES": [500, 502, 503, 504, 522, 524, 408],
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "LOG_LEVEL": "INFO",
    }

    def start_requests(self):
        self.pages = int(self.pages)
        for base in self.start.split(","):
            for i in range(self.pages):
                yield self.fetch(f"{base}page/{i}")

    def fetch(self, url):
        return scrapy.Request(url, meta={"proxy": self.gateway, "handle_httpstatus_list": [429]}, dont_filter=True)

    def parse(self, response):
        if response.status == 429:
            self.report(response)
            yield self.fetch(response.url)
            return
        yield {"url": response.url, "body": response.text}

    def report(self, response):
        host = urllib.parse.urlsplit(response.url).hostname
        retry_after = response.headers.get("Retry-After", b"0").decode()
        body = json.dumps({"result": "rate_limited", "target": host,
                           "retryAfterSeconds": int(retry_after) if retry_after.isdigit() else 0}).encode()
        req = urllib.request.Request(f"{self.api}/v1/sessions/{self.session}/report", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            self.logger.info("reported %s rate-limiting session %s: %s", host, self.session, r.status)
