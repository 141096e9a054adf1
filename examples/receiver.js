#!/usr/bin/env node
// receiver.js — a webhook receiver that verifies what streaming-hub sends.
//
//   WEBHOOK_SECRET=whsec_... node receiver.js [PORT]
//
// Answers the verification probe by echoing its challenge, and for every
// delivery checks the Standard Webhooks signature (HMAC-SHA256 over
// "<webhook-id>.<webhook-timestamp>.<body>") and the X-Lerian-Signature
// (HMAC-SHA256 over "v1:<timestamp>.<body>", hex), with any of the
// space-separated entries matching (two during a secret rotation), and a
// timestamp at most 5 minutes old.  Deduplicate on X-Lerian-Event-Id: delivery
// is at-least-once.
'use strict';
const http = require('http');
const crypto = require('crypto');

const secret = process.env.WEBHOOK_SECRET || '';
if (!secret.startsWith('whsec_')) {
  console.error('set WEBHOOK_SECRET to the whsec_... secret the subscription returned');
  process.exit(2);
}
const key = Buffer.from(secret.slice('whsec_'.length), 'base64');
const seen = new Set();

function safeEqual(a, b) {
  const x = Buffer.from(a), y = Buffer.from(b);
  return x.length === y.length && crypto.timingSafeEqual(x, y);
}

function verify(h, body) {
  const id = h['webhook-id'], ts = h['webhook-timestamp'];
  if (!id || !ts || Math.abs(Date.now() / 1000 - Number(ts)) > 300) return false;
  const std = 'v1,' + crypto.createHmac('sha256', key).update(`${id}.${ts}.`).update(body).digest('base64');
  const ler = 'v1,sha256=' + crypto.createHmac('sha256', key).update(`v1:${ts}.`).update(body).digest('hex');
  const okStd = (h['webhook-signature'] || '').split(' ').some((s) => safeEqual(s, std));
  const okLer = (h['x-lerian-signature'] || '').split(' ').some((s) => safeEqual(s, ler));
  return okStd && okLer;
}

http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    if (!verify(req.headers, body)) {
      res.writeHead(401).end('bad signature');
      console.log('REJECTED', req.headers['x-lerian-event-id']);
      return;
    }
    if (req.headers['x-lerian-event-type'] === 'subscription.verification') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(body); // echoes the challenge
      console.log('verification probe answered');
      return;
    }
    const eventId = req.headers['x-lerian-event-id'];
    const dup = seen.has(eventId);
    seen.add(eventId);
    console.log(`${dup ? 'DUPLICATE' : 'DELIVERED'} ${req.headers['x-lerian-event-type']} ` +
                `${eventId} attempt ${req.headers['x-lerian-attempt']}: ${body.toString()}`);
    res.writeHead(204).end();
  });
}).listen(Number(process.argv[2] || 9000), '127.0.0.1', () => {
  console.log(`receiver on http://127.0.0.1:${process.argv[2] || 9000}`);
});
